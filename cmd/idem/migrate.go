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
lock), and idem proxy applies the migrations itself when it
start; run this as a separate step where the services' database user may
not change the schema, or to prepare the database for the operator tools,
which never change it.

With --check nothing is changed: it reports the schema version, or the
migrations missing, and exits 1 when some are.

The DSN may hold a password: no message repeats it.

Reference: `+docsURL("docs/postgres.md")+`

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

	before, err := pgstore.Applied(ctx, *dsn)
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
	db, err := pgstore.Open(ctx, *dsn, &pgstore.Options{Logger: log, Migrate: mode, SweepInterval: -1})
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
	after, err := pgstore.Applied(ctx, *dsn)
	if err != nil {
		fmt.Fprintf(stderr, "idem migrate: %s: %v\n", where, err)
		return 1
	}
	for _, m := range after {
		if !slices.Contains(before, m) {
			fmt.Fprintf(stdout, "applied migration %d (%s)\n", m.Version, m.Name)
		}
	}
	version := 0
	if len(after) > 0 {
		version = after[len(after)-1].Version
	}
	fmt.Fprintf(stdout, "%s is at schema version %d, up to date\n", upper(where), version)
	return 0
}

// upper capitalises the first letter of s, for where at the start of a
// sentence.
func upper(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
