package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
	"github.com/idemkv/idem/pgstore"
)

// Every command that opens a store names it the same way, with the flags
// in this file: --data DIR for the embedded store (the default), or
// --store DSN for PostgreSQL. The DSN may hold a password, so no message
// repeats it: they say "the PostgreSQL store", with its host and port at
// most.

// defaultDataDir is --data's default.
const defaultDataDir = "./idem-data"

// storeHelp is --store's help, the same for every command that has --data
// too.
const storeHelp = "PostgreSQL connection string (postgres://user@host:port/db): keep the records there instead of in --data. " + passwordHint

// passwordHint ends the help of every --store flag. pgx reads PGPASSWORD
// and ~/.pgpass, as libpq does.
const passwordHint = "A password in it is never printed, but the process list shows it: PGPASSWORD or ~/.pgpass keep it out of sight"

// toolStoreRule ends the help of every tool that opens a store.
const toolStoreRule = `With --data the tool needs the directory to itself: a running proxy
holds it and must be stopped first (SIGTERM lets its requests
finish). With --store DSN the records are in PostgreSQL, which has many
users at once: the tool runs while proxy processes use the same
database.
`

// adminToolRule follows toolStoreRule in the help of the tools that take
// --admin.
const adminToolRule = `With --admin URL the tool works through a running proxy instead,
on its admin listener, with the admin token from --admin-token-file or
` + adminTokenEnv + `: the server must have been started with the same token.
`

// openTimeout bounds opening a PostgreSQL store: an address that drops
// packets fails the command instead of holding it for minutes. It covers
// the migrations the proxy applies too; one cut off rolls back, and
// idem migrate, which has no such bound, can apply it instead.
const openTimeout = time.Minute

// storeFlags are --data and --store, and for the tools that can reach a
// running server, --admin and --admin-token-file.
type storeFlags struct {
	fs      *flag.FlagSet
	dir     string
	dsn     string
	dsnFile string
	// admin is the URL of a running proxy's admin listener, and
	// token reads the admin token; both are set by addAdmin only.
	admin string
	token *tokenSource
	// memory is --memory, the embedded store's budget; set by addMemory
	// only.
	memory byteSize
	// requireSync is --require-sync-standby; set by addMemory only.
	requireSync bool
}

// addStoreFlags registers --data and --store on fs. dataHelp describes
// --data for this command.
func addStoreFlags(fs *flag.FlagSet, dataHelp string) *storeFlags {
	s := &storeFlags{fs: fs}
	fs.StringVar(&s.dir, "data", defaultDataDir, dataHelp)
	fs.StringVar(&s.dsn, "store", "", storeHelp)
	fs.StringVar(&s.dsnFile, "store-file", "", "`FILE` holding --store's connection string, which then stays out of the process list (default: the "+storeDSNEnv+" environment variable, when neither is given)")
	return s
}

// addAdmin registers --admin and --admin-token-file, for a tool that can
// work through a running proxy instead of opening the store.
func (s *storeFlags) addAdmin() {
	s.fs.StringVar(&s.admin, "admin", "", "URL of a running proxy's admin listener (http://127.0.0.1:9464): work through it, while it runs, instead of opening --data or --store")
	s.token = adminTokenFlag(s.fs)
}

// addMemory registers --memory and --require-sync-standby, the settings
// of the proxy's store that the tools do not need.
func (s *storeFlags) addMemory() {
	s.fs.BoolVar(&s.requireSync, "require-sync-standby", false, "refuse to start unless PostgreSQL acknowledges a commit only once a synchronous standby has it, so that a failover to that standby loses no acknowledged answer (see "+docsURL("docs/postgres.md#durability")+"); --store only")
	s.fs.Var(&s.memory, "memory", "memory the embedded store holds for itself, a `SIZE` such as 16MiB or 64MiB: its cache, write buffers and key filter share it, and the disk it keeps when empty shrinks with it. 0 sizes it for a server, about 200MiB and more. The process needs more than this: see docs/devices.md. At least 4MiB; --data only")
}

// storeDSNEnv holds the connection string when neither --store nor
// --store-file is given.
const storeDSNEnv = "IDEM_STORE_DSN"

// resolveDSN takes the connection string from --store-file, or from
// storeDSNEnv when no flag names a store: an explicit --data wins over
// the environment.
func (s *storeFlags) resolveDSN(dataSet bool) error {
	switch {
	case s.dsnFile != "" && s.dsn != "":
		return errors.New("--store and --store-file both give the connection string; give one")
	case s.dsnFile != "":
		b, err := os.ReadFile(s.dsnFile)
		if err != nil {
			return fmt.Errorf("--store-file: %w", err)
		}
		if s.dsn = strings.TrimSpace(string(b)); s.dsn == "" {
			return errors.New("--store-file is empty")
		}
	case s.dsn == "" && !dataSet:
		s.dsn = strings.TrimSpace(os.Getenv(storeDSNEnv))
	}
	return nil
}

// postgres reports whether the records are in PostgreSQL.
func (s *storeFlags) postgres() bool { return s.dsn != "" }

// validate reports a usage mistake: both flags, which name two different
// stores, or a DSN that does not parse. Call it after fs.Parse.
func (s *storeFlags) validate() error {
	dataSet, tokenSet := false, false
	s.fs.Visit(func(f *flag.Flag) {
		dataSet = dataSet || f.Name == "data"
		tokenSet = tokenSet || f.Name == "admin-token-file"
	})
	if err := s.resolveDSN(dataSet || s.admin != ""); err != nil {
		return err
	}
	if tokenSet && s.admin == "" && s.token != nil { // the proxy takes the token for itself
		return errors.New("--admin-token-file goes with --admin URL")
	}
	if s.admin != "" {
		if dataSet || s.postgres() {
			return errors.New("--admin reaches the store through a running server; give it without --data or --store")
		}
		u, err := url.Parse(s.admin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return errors.New("--admin wants the admin listener's URL, such as http://127.0.0.1:9464")
		}
		return nil
	}
	if least := byteSize(pebblestore.MinMemoryBytes); s.memory != 0 && s.memory < least {
		return fmt.Errorf("--memory %s is below the smallest budget, %s", &s.memory, &least)
	}
	if !s.postgres() {
		if s.requireSync {
			return errors.New("--require-sync-standby is about PostgreSQL's standbys; it goes with --store")
		}
		return nil
	}
	if s.memory != 0 {
		return errors.New("--memory sizes the embedded store; PostgreSQL's memory is the server's own")
	}
	if dataSet {
		return errors.New("--data and --store name two different stores; give one")
	}
	// pgconn's errors quote the string, so the reason is not shown.
	if _, err := pgconn.ParseConfig(s.dsn); err != nil {
		return errors.New("--store is not a PostgreSQL connection string (postgres://user:password@host:port/db or key=value pairs)")
	}
	return nil
}

// where says where the records are, for people: the directory, or the
// PostgreSQL server's host and port.
func (s *storeFlags) where() string {
	if !s.postgres() {
		return s.dir
	}
	return pgWhere(s.dsn)
}

// pgWhere names the PostgreSQL store dsn points at by its host and port,
// never by anything that may be secret.
func pgWhere(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil || cfg.Host == "" {
		return "the PostgreSQL store"
	}
	host := cfg.Host
	if !strings.HasPrefix(host, "/") { // a Unix socket's directory has no port to add
		host = net.JoinHostPort(host, strconv.Itoa(int(cfg.Port)))
	}
	return "the PostgreSQL store at " + host
}

// serverOptions are the settings the proxy gives either store; zero
// means the store's default.
type serverOptions struct {
	ttl, lease time.Duration
	// endpointTTL overrides ttl for the endpoints it names.
	endpointTTL map[string]time.Duration
	// maxBodyBytes is the largest response body kept for replays.
	maxBodyBytes int64
	logger       *slog.Logger
	events       bool
	// reconcile, when set, is handed the claims whose lease ran out, after
	// each of the store's sweeps.
	reconcile func(context.Context, idem.Lease) error
}

// openServer opens the store for the proxy, creating it (a directory,
// or the PostgreSQL schema) when it is missing. It returns the exit
// status on failure: 2 for bad options, 1 otherwise.
func (s *storeFlags) openServer(name string, o serverOptions, stderr io.Writer) (idem.Operator, int) {
	var events *slog.Logger
	if o.events {
		events = o.logger
	}
	if !s.postgres() {
		opts := &pebblestore.Options{TTL: o.ttl, EndpointTTL: o.endpointTTL, Lease: o.lease, MaxBodyBytes: o.maxBodyBytes, Logger: o.logger, Events: events,
			Reconcile: o.reconcile}
		if s.memory != 0 && os.Getenv("GOMEMLIMIT") == "" {
			debug.SetMemoryLimit(pebblestore.GoMemoryLimit(int64(s.memory)))
		}
		if o.maxBodyBytes > 0 {
			// Bodies are kept inside the record up to the smaller of the
			// two, which pebblestore.Open requires to be no larger than the cap.
			opts.InlineBodyBytes = int(min(64<<10, o.maxBodyBytes))
		}
		return openStore(name, s.dir, opts, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	db, err := pgstore.Open(ctx, s.dsn, &pgstore.Options{TTL: o.ttl, EndpointTTL: o.endpointTTL, Lease: o.lease, MaxBodyBytes: o.maxBodyBytes, Logger: o.logger, Events: events,
		Reconcile: o.reconcile, Migrate: pgstore.MigrateApply, RequireSynchronousStandby: s.requireSync})
	if err != nil {
		return nil, s.pgOpenFailed(name, err, stderr)
	}
	return db, 0
}

// openTool opens an existing store for the tool called name; events says
// whether the store logs its events. A tool never creates a store: in
// PostgreSQL it never applies migrations, so a tool pointed at the wrong
// database changes nothing there. It returns the exit status on failure:
// 1 for a missing, busy or out-of-date store, 2 for bad usage.
func (s *storeFlags) openTool(name string, events bool, stderr io.Writer) (idem.Operator, int) {
	if !s.postgres() {
		return openExisting(name, s.dir, events, stderr)
	}
	log := newLogger(stderr)
	// A tool leaves sweeping to the servers.
	opts := &pgstore.Options{Logger: log, Migrate: pgstore.MigrateRefuse, SweepInterval: -1}
	if events {
		opts.Events = log
	}
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	db, err := pgstore.Open(ctx, s.dsn, opts)
	if err != nil {
		return nil, s.pgOpenFailed(name, err, stderr)
	}
	return db, 0
}

// toolStore is what inspect, get, stats and resolve need of a store: an
// opened one (localTools), or a running server's admin listener
// (adminClient).
type toolStore interface {
	Get(ctx context.Context, s idem.Scope) (*idem.Record, error)
	Records(ctx context.Context, f idem.Filter) iter.Seq2[*idem.Record, error]
	Metrics(ctx context.Context) (idem.Metrics, error)
	// Resolve settles the stuck record at s as res says and returns the
	// record as it was before.
	Resolve(ctx context.Context, s idem.Scope, res resolution) (*idem.Record, error)
	Close() error
}

// localTools is a toolStore over a store the tool opened itself.
type localTools struct{ idem.Operator }

func (l localTools) Resolve(ctx context.Context, s idem.Scope, res resolution) (*idem.Record, error) {
	return settle(ctx, l.Operator, s, res)
}

// openTools is openTool for a tool that registered addAdmin: with --admin
// it works through the server, which needs the admin token.
func (s *storeFlags) openTools(name string, events bool, stderr io.Writer) (toolStore, int) {
	if s.admin == "" {
		db, code := s.openTool(name, events, stderr)
		if db == nil {
			return nil, code
		}
		return localTools{db}, 0
	}
	c, code := s.openAdmin(name, stderr)
	if c == nil {
		return nil, code
	}
	return c, 0
}

// openAdmin is the client of the admin listener --admin names, for the
// tool called name, with the admin token. It returns the exit status on
// failure: 2, since the token is missing or unreadable.
func (s *storeFlags) openAdmin(name string, stderr io.Writer) (*adminClient, int) {
	token, err := s.token.read(stderr)
	if err == nil && token == "" {
		err = fmt.Errorf("--admin needs the admin token: --admin-token-file FILE or %s", adminTokenEnv)
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		return nil, 2
	}
	return newAdminClient(s.admin, token), 0
}

// pgOpenFailed prints why pgstore.Open failed and returns the exit status.
// pgstore's errors never repeat the DSN.
func (s *storeFlags) pgOpenFailed(name string, err error, stderr io.Writer) int {
	switch {
	case errors.Is(err, idem.ErrInvalidOptions):
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		return 2
	case errors.Is(err, pgstore.ErrSchemaBehind):
		fmt.Fprintf(stderr, "idem %s: %s has no idem schema, or an older one: %s.\n"+
			"The tools never change the schema; if this is the right database, run idem migrate --store DSN (or start idem proxy on it) first.\n",
			name, s.where(), schemaDetail(err))
	default:
		fmt.Fprintf(stderr, "idem %s: %s: %v\n", name, s.where(), err)
	}
	return 1
}

// schemaDetail says which schema version this build needs and which
// versions the database lacks.
func schemaDetail(err error) string {
	var sb *pgstore.SchemaBehindError
	if !errors.As(err, &sb) {
		return err.Error()
	}
	missing := make([]string, len(sb.Missing))
	for i, v := range sb.Missing {
		missing[i] = strconv.Itoa(v)
	}
	return fmt.Sprintf("this build needs schema version %d; the database lacks version %s", sb.Need, strings.Join(missing, ", "))
}
