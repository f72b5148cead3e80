package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pgstore"
)

// pgstoreSchema holds pgstore's tables during a run. pgstore names its
// table idempotency_keys, as the reference does, so it gets a schema of
// its own beside pgSchema in the same database; it is dropped at the end.
const pgstoreSchema = "idem_bench_pgstore"

// pgstoreSystem is package pgstore, opened with nil options, on the
// server and database the postgres system uses: the same workload, with
// the contract's work on top (lease token and times, the body's length
// and digest, the record read back, a NOTIFY when someone waits). A
// replay is a Claim of the same key and fingerprint, as for idem.
type pgstoreSystem struct {
	s   *pgstore.Store
	dsn string // -pg, to drop the schema with
}

func openPgstore(e env) (system, error) {
	if e.pgDSN == "" {
		return nil, errors.New("needs -pg DSN")
	}
	ctx := context.Background()
	if err := pgExec(ctx, e.pgDSN, true,
		"DROP SCHEMA IF EXISTS "+pgstoreSchema+" CASCADE",
		"CREATE SCHEMA "+pgstoreSchema); err != nil {
		return nil, err
	}
	// The schema goes first on the search path. The pool gets as many
	// connections as the postgres system's, so both rows run with one
	// backend per caller; pgxpool's own default is max(4, processors).
	dsn, err := dsnWith(e.pgDSN, map[string]string{
		"search_path":    pgstoreSchema,
		"pool_max_conns": strconv.Itoa(e.maxConc),
		"pool_min_conns": "1",
	})
	if err != nil {
		return nil, err
	}
	s, err := pgstore.Open(ctx, dsn, nil)
	if err != nil {
		pgExec(ctx, e.pgDSN, false, "DROP SCHEMA IF EXISTS "+pgstoreSchema+" CASCADE")
		return nil, err
	}
	return &pgstoreSystem{s: s, dsn: e.pgDSN}, nil
}

// pgExec runs stmts on one connection to dsn, after checking that the
// server's commits are durable when durable is set.
func pgExec(ctx context.Context, dsn string, durable bool, stmts ...string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if durable {
		if err := checkDurable(ctx, conn); err != nil {
			return err
		}
	}
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// dsnWith returns dsn with params set, in either of the forms pgx
// accepts: a URL, or keyword=value pairs.
func dsnWith(dsn string, params map[string]string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("cannot parse the -pg URL")
		}
		q := u.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	var b strings.Builder
	b.WriteString(dsn)
	for k, v := range params {
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return b.String(), nil
}

func (p *pgstoreSystem) scope(o op) idem.Scope {
	return idem.Scope{Tenant: o.tenant, Endpoint: endpoint, Key: o.key}
}

func (p *pgstoreSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	l, _, err := p.s.Claim(ctx, p.scope(o), o.fp)
	if err != nil {
		return err
	}
	if l == nil {
		return errors.New("bench: key exists")
	}
	return l.Complete(ctx, idem.Response{Status: 201, Header: benchHeader, Body: body})
}

func (p *pgstoreSystem) replay(ctx context.Context, o op) ([]byte, error) {
	_, rec, err := p.s.Claim(ctx, p.scope(o), o.fp)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.State != idem.StateCompleted {
		return nil, errors.New("bench: replay found no completed record")
	}
	return rec.Response.Body, nil
}

func (p *pgstoreSystem) syncsPerOp() float64 { return 0 }

func (p *pgstoreSystem) close() error {
	err := p.s.Close()
	return errors.Join(err, pgExec(context.Background(), p.dsn, false, "DROP SCHEMA IF EXISTS "+pgstoreSchema+" CASCADE"))
}
