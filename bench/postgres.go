package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgSchema holds the benchmark's table, so that a -pg pointing at a real
// database never touches an idempotency_keys table of its own. It is
// dropped at the end.
const pgSchema = "idem_bench"

// pgTable is the reference's table exactly, column for column, with the
// index on expires_at the reference gives it for cleanup.
const pgTable = `CREATE TABLE idempotency_keys (
  id               bigserial PRIMARY KEY,
  tenant_id        uuid        NOT NULL,
  endpoint         text        NOT NULL,
  idem_key         text        NOT NULL,
  fingerprint      bytea       NOT NULL,
  state            text        NOT NULL,
  response_status  int,
  response_body    bytea,
  response_headers jsonb,
  locked_until     timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL,
  UNIQUE (tenant_id, endpoint, idem_key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at)`

// pgDayTable is pgTable partitioned by the day of creation, the layout the
// reference suggests so that a sweep drops a whole day's partition and the
// expires_at index goes. PostgreSQL makes a unique constraint of a
// partitioned table include the partition key, so the key is unique per
// day only: a retry on the day after its claim inserts a second row and
// runs again. The row exists to measure what the layout would save; the
// partitions cover the days a run can span.
const pgDayTable = `CREATE TABLE idempotency_keys (
  id               bigserial,
  tenant_id        uuid        NOT NULL,
  endpoint         text        NOT NULL,
  idem_key         text        NOT NULL,
  fingerprint      bytea       NOT NULL,
  state            text        NOT NULL,
  response_status  int,
  response_body    bytea,
  response_headers jsonb,
  locked_until     timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  created_on       date        NOT NULL DEFAULT current_date,
  expires_at       timestamptz NOT NULL,
  PRIMARY KEY (id, created_on),
  UNIQUE (tenant_id, endpoint, idem_key, created_on)
) PARTITION BY RANGE (created_on);
CREATE TABLE idempotency_keys_today PARTITION OF idempotency_keys FOR VALUES FROM (current_date - 1) TO (current_date + 1);
CREATE TABLE idempotency_keys_tomorrow PARTITION OF idempotency_keys FOR VALUES FROM (current_date + 1) TO (current_date + 2)`

// The claim names no conflict target, so that it fits both tables: each
// has one unique constraint a claim can meet.
const (
	pgClaim = `INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, state, expires_at)
VALUES ($1, $2, $3, $4, 'in_progress', now() + interval '24 hours')
ON CONFLICT DO NOTHING
RETURNING id`
	pgComplete = `UPDATE idempotency_keys
SET state = 'completed', response_status = $2, response_body = $3, response_headers = $4
WHERE id = $1`
	pgReplay = `SELECT fingerprint, state, response_status, response_headers, response_body
FROM idempotency_keys
WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`
)

// postgresSystem is the reference's design as written: the table above,
// the claim as INSERT ... ON CONFLICT DO NOTHING and the completion as an
// UPDATE by id, each its own transaction, with synchronous_commit on, so
// each commits durably before it answers. PostgreSQL shares WAL flushes
// between concurrent commits on its own. A replay reads what it replays,
// status, headers and body, with one SELECT: unlike a server, which tries
// the insert first, it knows the key exists.
type postgresSystem struct {
	pool    *pgxpool.Pool
	table   string // pgTable or pgDayTable
	tenants [100]pgtype.UUID
}

// pgHeaders is the stored response_headers document.
const pgHeaders = `{"Content-Type":["application/json"]}`

func openPostgres(e env) (system, error) { return openPostgresTable(e, pgTable) }

// openPostgresDays is the postgres row on pgDayTable.
func openPostgresDays(e env) (system, error) { return openPostgresTable(e, pgDayTable) }

func openPostgresTable(e env, table string) (system, error) {
	if e.pgDSN == "" {
		return nil, errors.New("needs -pg DSN")
	}
	cfg, err := pgxpool.ParseConfig(e.pgDSN)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(e.maxConc), 1
	cfg.ConnConfig.RuntimeParams["search_path"] = pgSchema
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &postgresSystem{pool: pool, table: table}
	err = s.setup(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	for i := range s.tenants {
		// Fixed per tenant number, so runs are alike.
		s.tenants[i] = pgtype.UUID{Bytes: uuid.NewSHA1(uuid.NameSpaceURL, fmt.Appendf(nil, "tenant-%03d", i)), Valid: true}
	}
	return s, nil
}

// pgQuerier is what checkDurable needs of a pool or a connection.
type pgQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// checkDurable refuses a server whose commits answer before they are on
// disk.
func checkDurable(ctx context.Context, q pgQuerier) error {
	var sc string
	if err := q.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		return err
	}
	// Every other setting flushes the local WAL before a commit answers.
	if sc == "off" {
		return errors.New("synchronous_commit is off: commits would answer before they are durable, so the comparison would be unfair")
	}
	var fsync string
	if err := q.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
		return err
	}
	if fsync != "on" {
		return fmt.Errorf("fsync is %s: commits would not be durable, so the comparison would be unfair", fsync)
	}
	return nil
}

func (s *postgresSystem) setup(ctx context.Context) error {
	if err := checkDurable(ctx, s.pool); err != nil {
		return err
	}
	for _, q := range []string{
		"DROP SCHEMA IF EXISTS " + pgSchema + " CASCADE",
		"CREATE SCHEMA " + pgSchema,
		s.table,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func (s *postgresSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	var id int64
	err := s.pool.QueryRow(ctx, pgClaim, s.tenants[o.tenantN], endpoint, o.key, o.fp[:]).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.New("bench: key exists")
	}
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, pgComplete, id, 201, body, pgHeaders)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("bench: completion updated %d rows", tag.RowsAffected())
	}
	return err
}

func (s *postgresSystem) replay(ctx context.Context, o op) ([]byte, error) {
	var (
		fp, body []byte
		state    string
		status   int32
		header   http.Header
	)
	err := s.pool.QueryRow(ctx, pgReplay, s.tenants[o.tenantN], endpoint, o.key).Scan(&fp, &state, &status, &header, &body)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(fp, o.fp[:]) || state != "completed" || status != 201 || header.Get("Content-Type") == "" {
		return nil, fmt.Errorf("bench: replay found state %s, status %d, %d header fields", state, status, len(header))
	}
	return body, nil
}

func (s *postgresSystem) syncsPerOp() float64 { return 0 }

func (s *postgresSystem) close() error {
	_, err := s.pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgSchema+" CASCADE")
	s.pool.Close()
	return err
}
