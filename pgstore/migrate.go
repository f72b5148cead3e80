package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSchemaBehind: the database schema lacks migrations this package
// needs, and Options.Migrate forbade applying them. The error Open returns
// is a *SchemaBehindError that matches it.
var ErrSchemaBehind = errors.New("pgstore: database schema is behind")

// SchemaBehindError says which migrations the database lacks.
type SchemaBehindError struct {
	Need    int   // the schema version this build needs
	Missing []int // the versions not applied, in order
}

func (e *SchemaBehindError) Error() string {
	return fmt.Sprintf("%v: this build needs schema version %d; the database lacks %s (open with Migrate: MigrateApply to apply them)",
		ErrSchemaBehind, e.Need, versionList(e.Missing))
}

func (e *SchemaBehindError) Is(target error) bool { return target == ErrSchemaBehind }

// Migration is one applied step of the schema.
type Migration struct {
	Version int
	Name    string
}

// Applied returns the migrations applied to the database dsn names, in
// order, and changes nothing: none when it holds no idem schema. It reads
// the schema Open finds when Options.Schema is empty. Errors never repeat
// the DSN.
func Applied(ctx context.Context, dsn string) ([]Migration, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", scrub(err))
	}
	defer conn.Close(context.Background())
	sc, err := findSchema(ctx, conn, "")
	if err != nil {
		return nil, err
	}
	return appliedMigrations(ctx, conn, sc)
}

// migration is one step of the schema. What a released step does never
// changes; a change is a new step.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations are the schema's steps, in order, with the table written
// as {keys}, which newSchema qualifies. State codes are those of
// idem.State: 1 in_progress, 2 completed, 3 failed, 4 unknown. The
// scope's columns compare bytes (COLLATE "C"), as Go compares strings,
// whatever the database's locale.
var migrations = []migration{
	{1, "idempotency_keys", `
CREATE TABLE {keys} (
	tenant           text        COLLATE "C" NOT NULL,
	endpoint         text        COLLATE "C" NOT NULL,
	idem_key         text        COLLATE "C" NOT NULL,
	fingerprint      bytea       NOT NULL,
	state            smallint    NOT NULL CHECK (state BETWEEN 1 AND 4),
	response_status  int,
	response_headers jsonb,
	response_body    bytea,
	body_len         bigint      NOT NULL DEFAULT 0,
	body_digest      bytea,
	body_omitted     boolean     NOT NULL DEFAULT false,
	lease_token      bytea       NOT NULL,
	lease_until      timestamptz NOT NULL,
	attempts         int         NOT NULL,
	created_at       timestamptz NOT NULL,
	updated_at       timestamptz NOT NULL,
	expires_at       timestamptz NOT NULL,
	PRIMARY KEY (tenant, endpoint, idem_key)
);
CREATE INDEX idempotency_keys_expires_at ON {keys} (expires_at);
CREATE INDEX idempotency_keys_unsettled ON {keys} (lease_until) WHERE state <> 2;
`},
	// waiting is set by Wait before it sleeps, and never cleared: the end
	// of a lease notifies only when it is set (see waitSQL).
	{2, "idempotency_keys_waiting", `
ALTER TABLE {keys} ADD COLUMN waiting boolean NOT NULL DEFAULT false;
`},
}

// schemaVersion is the version this package needs.
func schemaVersion() int { return migrations[len(migrations)-1].version }

// Advisory lock keys, one per purpose, shared by every replica.
const (
	lockMigrate int64 = 0x6964656d0001 // "idem" 1
	lockSweep   int64 = 0x6964656d0002 // "idem" 2
)

// migrate brings the schema up to date, or checks that it is, as mode
// says. It returns the versions it applied.
func migrate(ctx context.Context, pool *pgxpool.Pool, sc *schema, mode MigrateMode) ([]int, error) {
	if mode == MigrateRefuse {
		have, err := appliedMigrations(ctx, pool, sc)
		if err != nil {
			return nil, err
		}
		if missing := missingVersions(have); len(missing) > 0 {
			return nil, &SchemaBehindError{Need: schemaVersion(), Missing: missing}
		}
		return nil, nil
	}
	var applied []int
	for {
		// One transaction per step, each under the lock, so a replica that
		// waited for another sees what it applied.
		v, err := migrateStep(ctx, pool, sc)
		if err != nil {
			return applied, err
		}
		if v == 0 {
			return applied, nil
		}
		applied = append(applied, v)
	}
}

// migrateStep applies the first missing migration in one transaction and
// returns its version, or 0 when none is missing.
func migrateStep(ctx context.Context, pool *pgxpool.Pool, sc *schema) (int, error) {
	var version int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockMigrate); err != nil {
			return fmt.Errorf("pgstore: lock for migration: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+sc.migrations+
			" (version int PRIMARY KEY, name text NOT NULL)"); err != nil {
			return fmt.Errorf("pgstore: create %s: %w", sc.migrations, err)
		}
		have, err := appliedMigrations(ctx, tx, sc)
		if err != nil {
			return err
		}
		missing := missingVersions(have)
		if len(missing) == 0 {
			return nil
		}
		for _, m := range migrations {
			if m.version != missing[0] {
				continue
			}
			if _, err := tx.Exec(ctx, sc.fill(m.sql)); err != nil {
				return fmt.Errorf("pgstore: migration %d (%s): %w", m.version, m.name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+sc.migrations+" (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
				return fmt.Errorf("pgstore: record migration %d: %w", m.version, err)
			}
			version = m.version
		}
		return nil
	})
	return version, err
}

// appliedMigrations reads the applied migrations, in order, without
// creating anything.
func appliedMigrations(ctx context.Context, q querier, sc *schema) ([]Migration, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", sc.migrations).Scan(&exists); err != nil {
		return nil, fmt.Errorf("pgstore: read schema version: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := q.Query(ctx, "SELECT version, name FROM "+sc.migrations+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("pgstore: read schema version: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Migration, error) {
		var (
			m Migration
			v int32
		)
		err := r.Scan(&v, &m.Name)
		m.Version = int(v)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: read schema version: %w", err)
	}
	return ms, nil
}

// missingVersions returns the versions of migrations not in have, in
// order.
func missingVersions(have []Migration) []int {
	var missing []int
	for _, m := range migrations {
		if !slices.ContainsFunc(have, func(h Migration) bool { return h.Version == m.version }) {
			missing = append(missing, m.version)
		}
	}
	return missing
}

func versionList(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return "version " + strings.Join(s, ", ")
}
