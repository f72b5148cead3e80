package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/google/uuid"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// op is one logical operation of the workload: a tenant, a key and the
// request it carries.
type op struct {
	tenantN int // 0-99; PostgreSQL maps it to a uuid
	tenant  string
	key     string
	fp      idem.Fingerprint
}

func newOp(tenant int) op {
	key := uuid.NewString()
	return op{tenantN: tenant, tenant: fmt.Sprintf("tenant-%03d", tenant), key: key, fp: sha256.Sum256([]byte(key))}
}

const endpoint = "POST /v1/payments"

// system is one store under test.
type system interface {
	// claimComplete durably claims o, then durably stores body as its
	// response, as a server does around one operation.
	claimComplete(ctx context.Context, o op, body []byte) error
	// replay answers a retry of a completed o with its stored response.
	replay(ctx context.Context, o op) ([]byte, error)
	// syncsPerOp is how many WAL syncs one claimComplete cost on average
	// since the previous call, or 0 when the system does not know.
	syncsPerOp() float64
	close() error
}

// env is what a system is opened with.
type env struct {
	dir       string // the system's own directory, to create
	maxConc   int    // the highest concurrency it will see: pools are sized to it
	bodies    bodies // the response bodies a server answers with
	pgDSN     string // -pg
	redisAddr string // -redis
}

// cellStarter is implemented by systems that want to know the concurrency
// of the claim+complete cell about to run.
type cellStarter interface{ startCell(conc int) }

// noReplay is implemented by systems that have no replay workload.
type noReplay interface{ noReplay() }

// idemSystem is the idem library on its default options.
type idemSystem struct {
	db    *pebblestore.Store
	syncs syncCounter
}

// syncCounter turns a store's running totals of commits and WAL syncs
// into syncs per claim+complete since the previous call.
type syncCounter struct{ lastCommits, lastSyncs int64 }

func (c *syncCounter) perOp(totalCommits, totalSyncs float64) float64 {
	commits, syncs := int64(totalCommits)-c.lastCommits, int64(totalSyncs)-c.lastSyncs
	c.lastCommits, c.lastSyncs = int64(totalCommits), int64(totalSyncs)
	if commits == 0 {
		return 0
	}
	// Two commits (claim, complete) per operation.
	return 2 * float64(syncs) / float64(commits)
}

// dbSyncsPerOp is syncCounter.perOp over db's own figures, 0 when they
// cannot be read.
func dbSyncsPerOp(db *pebblestore.Store, c *syncCounter) float64 {
	m, err := db.Metrics(context.Background())
	if err != nil {
		return 0
	}
	commits, _ := m.Figure(pebblestore.FigureCommits)
	syncs, _ := m.Figure(pebblestore.FigureSyncs)
	return c.perOp(commits, syncs)
}

// dbBytesWritten is what the embedded store counts it wrote to its
// files (pebblestore.FigureBytesWritten): logs and the zeros kept ahead of them,
// tables, blob files, manifests.
func dbBytesWritten(ctx context.Context, db *pebblestore.Store) (uint64, error) {
	m, err := db.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	n, ok := m.Figure(pebblestore.FigureBytesWritten)
	if !ok {
		return 0, errors.New("bench: the store's metrics have no " + pebblestore.FigureBytesWritten)
	}
	return uint64(n), nil
}

func openIdem(e env) (system, error) {
	db, err := pebblestore.Open(e.dir, nil)
	if err != nil {
		return nil, err
	}
	return &idemSystem{db: db}, nil
}

func (s *idemSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	l, _, err := s.db.Claim(ctx, idem.Scope{Tenant: o.tenant, Endpoint: endpoint, Key: o.key}, o.fp)
	if err != nil {
		return err
	}
	return l.Complete(ctx, idem.Response{Status: 201, Header: benchHeader, Body: body})
}

var benchHeader = map[string][]string{"Content-Type": {"application/json"}}

func (s *idemSystem) replay(ctx context.Context, o op) ([]byte, error) {
	_, rec, err := s.db.Claim(ctx, idem.Scope{Tenant: o.tenant, Endpoint: endpoint, Key: o.key}, o.fp)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, errors.New("bench: replay found no record")
	}
	return rec.Response.Body, nil
}

func (s *idemSystem) syncsPerOp() float64 { return dbSyncsPerOp(s.db, &s.syncs) }

func (s *idemSystem) bytesWritten(ctx context.Context) (uint64, error) {
	return dbBytesWritten(ctx, s.db)
}

func (s *idemSystem) close() error { return s.db.Close() }

// pebbleSystem is the naive baseline: what a careful developer writes by
// hand on Pebble. Each write is its own synced Set under a striped mutex,
// so concurrent writers share syncs only as far as Pebble's own commit
// pipeline groups them. "pebble" runs on Pebble's default options, as a
// first version would; "pebble-tuned" gets the tuning idem uses (bloom
// filters, a larger cache and memtable, compression, value separation), so
// that the difference between it and idem is idem's own doing.
type pebbleSystem struct {
	db      *pebble.DB
	seed    maphash.Seed
	stripes [4096]sync.Mutex
}

func openPebble(e env, tuned bool) (system, error) {
	opts := &pebble.Options{Logger: quietLogger{}, FormatMajorVersion: pebble.FormatNewest}
	if tuned {
		// As idem: a 64 MiB block cache on top of the share Pebble takes
		// of it for two 64 MiB memtables, the fastest compression, and
		// values of 512 bytes or more in blob files.
		opts.CacheSize, opts.MemTableSize = 3*64<<20, 64<<20
		opts.Levels[0].Compression = func() *sstable.CompressionProfile { return sstable.FastestCompression }
		opts.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
		opts.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
			return pebble.ValueSeparationPolicy{Enabled: true, MinimumSize: 512, MaxBlobReferenceDepth: 1000, RewriteMinimumAge: time.Hour, TargetGarbageRatio: 0.2}
		}
	}
	db, err := pebble.Open(e.dir, opts)
	if err != nil {
		return nil, err
	}
	return &pebbleSystem{db: db, seed: maphash.MakeSeed()}, nil
}

func (s *pebbleSystem) rowKey(o op) []byte {
	return fmt.Appendf(nil, "%s\x00%s\x00%s", o.tenant, endpoint, o.key)
}

func (s *pebbleSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	k := s.rowKey(o)
	mu := &s.stripes[maphash.Bytes(s.seed, k)%uint64(len(s.stripes))]
	mu.Lock()
	_, closer, err := s.db.Get(k)
	if err == nil {
		closer.Close()
		mu.Unlock()
		return errors.New("bench: key exists")
	}
	if !errors.Is(err, pebble.ErrNotFound) {
		mu.Unlock()
		return err
	}
	// fingerprint, state, expires_at
	claim := binary.BigEndian.AppendUint64(append(append([]byte{}, o.fp[:]...), 'p'), uint64(time.Now().Add(24*time.Hour).UnixNano()))
	err = s.db.Set(k, claim, pebble.Sync)
	mu.Unlock()
	if err != nil {
		return err
	}
	done := append(append(append([]byte{}, o.fp[:]...), 'c'), body...)
	mu.Lock()
	defer mu.Unlock()
	return s.db.Set(k, done, pebble.Sync)
}

func (s *pebbleSystem) replay(ctx context.Context, o op) ([]byte, error) {
	v, closer, err := s.db.Get(s.rowKey(o))
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	if len(v) < 33 || v[32] != 'c' {
		return nil, errors.New("bench: not completed")
	}
	return append([]byte(nil), v[33:]...), nil
}

func (s *pebbleSystem) syncsPerOp() float64 { return 0 }

// bytesWritten is what Pebble counts it wrote to its files: the WAL, the
// tables and blob files of flushes and of compactions.
func (s *pebbleSystem) bytesWritten(context.Context) (uint64, error) {
	m := s.db.Metrics()
	t := m.Total() // its flushed bytes include the WAL's
	return t.TableBytesFlushed + t.TableBytesCompacted + t.BlobBytesFlushed + t.BlobBytesCompacted, nil
}

// settle waits until no flush or compaction runs, so that those a cell
// started are written within it.
func (s *pebbleSystem) settle(ctx context.Context) error {
	for {
		m := s.db.Metrics()
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *pebbleSystem) close() error { return s.db.Close() }

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
	os.Exit(74)
}

// openers lists the systems by the names -systems accepts.
var openers = map[string]func(env) (system, error){
	"idem":          openIdem,
	"idem-http":     openIdemHTTP,
	"pebble":        func(e env) (system, error) { return openPebble(e, false) },
	"pebble-tuned":  func(e env) (system, error) { return openPebble(e, true) },
	"postgres":      openPostgres,
	"postgres-days": openPostgresDays,
	"pgstore":       openPgstore,
	"redis":         openRedis,
	"idem-proxy":    openIdemProxy,
	"upstream":      openUpstream,
	"proxy-hop":     openProxyHop,
	"proxy-pg-1":    openProxyPG(1),
	"proxy-pg-2":    openProxyPG(2),
	"proxy-pg-3":    openProxyPG(3),
	"disk":          openDisk,
}
