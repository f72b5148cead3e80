package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sqlReadOnly is the SQLSTATE of a write on a server that accepts reads
// only: a primary demoted to a standby, or one set read-only.
const sqlReadOnly = "25006"

// pooled runs statements on the pool and runs again, once, one that
// certainly did nothing: pgx says nothing of it was sent
// (pgconn.SafeToRetry), or the server refused it as read-only. A
// read-only server also empties the pool, so that the retry, and every
// call after it, connects afresh; with a DSN that names several hosts and
// target_session_attrs=read-write, that is to the new primary. A
// statement that may have reached a server that accepts writes is never
// run again: its outcome is unknown, and the caller reports it as such.
type pooled struct{ p *pgxpool.Pool }

// again reports whether a statement that failed with err did nothing and
// may run once more, and prepares the pool for it.
func (q pooled) again(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlReadOnly {
		q.p.Reset()
		return true
	}
	return pgconn.SafeToRetry(err)
}

func (q pooled) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := q.p.Exec(ctx, sql, args...)
	if q.again(ctx, err) {
		tag, err = q.p.Exec(ctx, sql, args...)
	}
	return tag, err
}

func (q pooled) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := q.p.Query(ctx, sql, args...)
	if q.again(ctx, err) {
		rows, err = q.p.Query(ctx, sql, args...)
	}
	return rows, err
}

func (q pooled) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return pooledRow{q: q, ctx: ctx, sql: sql, args: args}
}

func (q pooled) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return q.p.SendBatch(ctx, b)
}

func (q pooled) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := q.p.Begin(ctx)
	if q.again(ctx, err) {
		tx, err = q.p.Begin(ctx)
	}
	return tx, err
}

// pooledRow runs its statement when scanned, as pgx's rows do, so that
// a failure found there can be retried.
type pooledRow struct {
	q    pooled
	ctx  context.Context
	sql  string
	args []any
}

func (r pooledRow) Scan(dest ...any) error {
	err := r.q.p.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
	if r.q.again(r.ctx, err) {
		err = r.q.p.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
	}
	return err
}

// usable is the pool's PrepareConn: it turns away an idle connection
// whose server has closed it, as a restart or a failover does, so that a
// statement is never written into a dead socket, where it would seem
// sent and then fail with its outcome unknown. pgxpool pings connections
// idle for a second or more; this catches the ones used more recently,
// for the cost of one non-blocking read.
func usable(_ context.Context, c *pgx.Conn) (bool, error) {
	return !peerClosed(c.PgConn().Conn()), nil
}
