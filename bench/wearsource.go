package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemkv/idem/bench/device"
)

// ownWriter is implemented by systems that count the bytes they write to
// their files: a running total since they opened.
type ownWriter interface {
	bytesWritten(ctx context.Context) (uint64, error)
}

// settler is implemented by systems that can wait for the writes they
// defer, such as compactions, to finish.
type settler interface {
	settle(ctx context.Context) error
}

// wearFlags are the flags that say where the servers keep their files and
// whether PostgreSQL checkpoints after each cell.
type wearFlags struct {
	pgData, redisData string
	pgCheckpoint      bool
}

// newWearSources returns, for each system, where its bytes written are
// counted. Systems in process write under env.dir (upstream writes
// nothing, and counts the device that would hold its directory, which
// shows the device's background); the systems on a server write to its
// data directory, which the flags name or the server reports.
func newWearSources(ctx context.Context, h device.Host, cfg config, systems map[string]system, envs map[string]env) map[string]*wearSource {
	out := map[string]*wearSource{}
	var pg, rd *wearSource
	for name, s := range systems {
		var w *wearSource
		switch {
		case usesPG(name):
			if pg == nil {
				pg = pgWearSource(ctx, h, cfg.pgDSN, cfg.wear.pgData, cfg.wear.pgCheckpoint)
			}
			w = pg
		case name == "redis":
			if rd == nil {
				rd = redisWearSource(ctx, h, cfg.redisAddr, cfg.wear.redisData)
			}
			w = rd
		default:
			w = &wearSource{}
			w.locate(h, envs[name].dir)
			if o, ok := s.(ownWriter); ok {
				w.own = o.bytesWritten
			}
			if st, ok := s.(settler); ok {
				w.settle = st.settle
			}
		}
		out[name] = w
	}
	return out
}

// usesPG reports whether system name stores its records in the -pg
// server.
func usesPG(name string) bool {
	return name == "postgres" || name == "postgres-days" || name == "pgstore" || strings.HasPrefix(name, "proxy-pg-")
}

// locate finds the devices holding dirs, or says in noDev why there are
// none, and the reason on standard error.
func (w *wearSource) locate(h device.Host, dirs ...string) {
	devs, err := h.Devices(dirs)
	if err != nil {
		w.noDev = "n/a"
		var nd *device.NoDeviceError
		if errors.As(err, &nd) {
			w.noDev = nd.Short
		}
		fmt.Fprintf(os.Stderr, "bench: bytes-written/op of %s is %s: %v\n", strings.Join(dirs, ", "), w.noDev, err)
		return
	}
	w.devs = devs
}

// pgWearSource counts the device of the server's data directory and of
// its pg_wal, which may be a link to another device. Its own figure is
// the WAL the server wrote, from pg_current_wal_lsn(). With checkpoint,
// its settle is a CHECKPOINT, which writes the pages a cell dirtied to
// the tables, where they would otherwise wait for the next timed
// checkpoint, after the cell or after the run.
func pgWearSource(ctx context.Context, h device.Host, dsn, dataDir string, checkpoint bool) *wearSource {
	w := &wearSource{}
	if dataDir == "" {
		var err error
		if dataDir, err = pgDataDir(ctx, dsn); err != nil {
			w.noDev = "n/a (-pg-data)"
			fmt.Fprintf(os.Stderr, "bench: bytes-written/op of PostgreSQL is %s: %v\n", w.noDev, err)
		}
	}
	if dataDir != "" {
		w.locate(h, dataDir, filepath.Join(dataDir, "pg_wal"))
	}
	w.own = func(ctx context.Context) (uint64, error) {
		var n int64
		err := pgQuery(ctx, dsn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint", &n)
		return uint64(n), err
	}
	if !checkpoint {
		return w
	}
	var warn sync.Once
	w.settle = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			_, err = conn.Exec(ctx, "CHECKPOINT")
			conn.Close(ctx)
		}
		if err != nil {
			warn.Do(func() {
				fmt.Fprintf(os.Stderr, "bench: CHECKPOINT failed, so the pages PostgreSQL dirties are not all written within their cells: %v\n", err)
			})
		}
		return nil
	}
	return w
}

// pgDataDir asks a server on this machine for its data directory.
func pgDataDir(ctx context.Context, dsn string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	if !onThisMachine(cfg.Host) {
		return "", fmt.Errorf("the server at %s is not on this machine", cfg.Host)
	}
	var dir string
	if err := pgQuery(ctx, dsn, "SHOW data_directory", &dir); err != nil {
		return "", fmt.Errorf("SHOW data_directory (needs a superuser or pg_read_all_settings; or pass -pg-data): %w", err)
	}
	return dir, nil
}

func pgQuery(ctx context.Context, dsn, q string, dst any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, q).Scan(dst)
}

// onThisMachine reports whether host, from a DSN or an address, is a
// Unix socket directory or a loopback address.
func onThisMachine(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redisWearSource counts the device of the server's directory and of its
// AOF directory inside it. Its own figure is the AOF's growth
// (aof_current_size); a rewrite of the AOF shrinks it, and the cell then
// has no own figure. Redis defers nothing: every write is in the AOF,
// synced, when it is acknowledged.
func redisWearSource(ctx context.Context, h device.Host, addr, dir string) *wearSource {
	w := &wearSource{}
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	aofDir := ""
	if dir == "" {
		var err error
		if dir, aofDir, err = redisDirs(ctx, c, addr); err != nil {
			w.noDev = "n/a (-redis-data)"
			fmt.Fprintf(os.Stderr, "bench: bytes-written/op of Redis is %s: %v\n", w.noDev, err)
		}
	}
	if dir != "" {
		dirs := []string{dir}
		if aofDir != "" {
			dirs = append(dirs, filepath.Join(dir, aofDir))
		}
		w.locate(h, dirs...)
	}
	w.own = func(ctx context.Context) (uint64, error) {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return 0, err
		}
		return infoField(info, "aof_current_size")
	}
	return w
}

// redisDirs asks a server on this machine for its working directory and
// the AOF directory under it (Redis 7; empty before).
func redisDirs(ctx context.Context, c *redis.Client, addr string) (dir, aofDir string, err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", err
	}
	if !onThisMachine(host) {
		return "", "", fmt.Errorf("the server at %s is not on this machine", host)
	}
	got, err := c.ConfigGet(ctx, "dir").Result()
	if err != nil {
		return "", "", fmt.Errorf("CONFIG GET dir: %w", err)
	}
	aof, _ := c.ConfigGet(ctx, "appenddirname").Result()
	return got["dir"], aof["appenddirname"], nil
}

// infoField returns the number in the "name:value" line of an INFO reply.
func infoField(info, name string) (uint64, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: INFO has no %s", name)
}
