package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkv/idem/pgstore"
)

func runMigrate(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("store", "", "PostgreSQL connection string (postgres://user@host:port/db), required. "+passwordHint)
	check := fs.Bool("check", false, "change nothing: only report whether migrations are missing (exit status 1 if so)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem migrate --store DSN [--check]

Brings the schema of a PostgreSQL store up to date: applies the numbered
migrations this build needs and the database lacks, each in a transaction
of its own, and prints the schema version. Running it again applies
nothing. Replicas that start at the same moment take turns (an advisory
lock), and serve and proxy apply the migrations themselves when they
start; run this as a separate step where the services' database user may
not change the schema, or to prepare the database for the operator tools,
which never change it.

With --check nothing is changed: it reports the schema version, or the
migrations missing, and exits 1 when some are.

The DSN may hold a password: no message repeats it.

`)
		fs.PrintDefaults()
	}
	if code, done := parseTool(fs, args, stderr); done {
		return code
	}
	if *dsn == "" {
		return usageError(fs, stderr, "--store is required")
	}
	if _, err := pgconn.ParseConfig(*dsn); err != nil {
		return usageError(fs, stderr, "--store is not a PostgreSQL connection string (postgres://user:password@host:port/db or key=value pairs)")
	}
	where := pgWhere(*dsn)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	before, err := schemaVersions(ctx, *dsn)
	if err != nil {
		fmt.Fprintf(stderr, "idem migrate: %s: %v\n", where, err)
		return 1
	}
	mode := pgstore.MigrateApply
	if *check {
		mode = pgstore.MigrateRefuse
	}
	// Open applies the migrations, or checks them; the store itself is
	// not used. Its own log line about what it applied would repeat ours.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	db, err := pgstore.Open(ctx, *dsn, &pgstore.Options{Logger: log, Migrate: mode})
	switch {
	case errors.Is(err, pgstore.ErrSchemaBehind):
		fmt.Fprintf(stdout, "%s needs migrations (%s): run idem migrate --store DSN to apply them\n", where, schemaDetail(err))
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "idem migrate: %s: %v\n", where, err)
		return 1
	}
	if err := db.Close(); err != nil {
		fmt.Fprintf(stderr, "idem migrate: closing the store: %v\n", err)
		return 1
	}
	after, err := schemaVersions(ctx, *dsn)
	if err != nil {
		fmt.Fprintf(stderr, "idem migrate: %s: %v\n", where, err)
		return 1
	}
	for _, m := range after {
		if !slices.ContainsFunc(before, func(b schemaMigration) bool { return b.version == m.version }) {
			fmt.Fprintf(stdout, "applied migration %d (%s)\n", m.version, m.name)
		}
	}
	version := 0
	if len(after) > 0 {
		version = after[len(after)-1].version
	}
	fmt.Fprintf(stdout, "%s is at schema version %d, up to date\n", upper(where), version)
	return 0
}

// schemaMigration is one row of the table in which pgstore records the
// migrations it applied (its package doc names it).
type schemaMigration struct {
	version int
	name    string
}

// schemaVersions reads the migrations applied to the database dsn names,
// in order, without creating anything: none when it has no idem schema.
func schemaVersions(ctx context.Context, dsn string) ([]schemaMigration, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		// pgx's connect errors name the user and the database; only the
		// cause is shown.
		var ce *pgconn.ConnectError
		if errors.As(err, &ce) && errors.Unwrap(ce) != nil {
			return nil, fmt.Errorf("cannot connect: %w", errors.Unwrap(ce))
		}
		return nil, errors.New("cannot connect")
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('idem_schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading the schema version: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := conn.Query(ctx, "SELECT version, name FROM idem_schema_migrations ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("reading the schema version: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (schemaMigration, error) {
		var m schemaMigration
		var v int32
		err := r.Scan(&v, &m.name)
		m.version = int(v)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the schema version: %w", err)
	}
	return ms, nil
}

// upper capitalises the first letter of s, for where at the start of a
// sentence.
func upper(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
