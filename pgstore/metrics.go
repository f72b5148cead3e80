package pgstore

import (
	"context"
	"time"

	"github.com/idemkv/idem"
)

const metricsSQL = `SELECT
	count(*) FILTER (WHERE state = 1),
	count(*) FILTER (WHERE state = 1 AND lease_until <= $1),
	min(created_at) FILTER (WHERE state = 1),
	count(*) FILTER (WHERE state = 4),
	count(*) FILTER (WHERE state = 3),
	count(*) FILTER (WHERE expires_at <= $1),
	pg_total_relation_size($2::regclass)
FROM {keys}`

// Size returns the room the records' table takes, its indexes and TOAST
// included, for idem.Limits' guard; the server's disk is not pgstore's to
// see, so FreeBytes is -1.
func (s *Store) Size(ctx context.Context) (idem.StoreSize, error) {
	if err := s.enter(); err != nil {
		return idem.StoreSize{}, err
	}
	sz := idem.StoreSize{FreeBytes: -1}
	if err := s.db.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", s.sql.keys).Scan(&sz.Bytes); err != nil {
		return sz, s.fail("size", err)
	}
	return sz, nil
}

// Metrics returns the event counts of this process since Open, and the
// stored records that are not completed, expired ones included until a
// sweep deletes them, counted over the whole table (every replica's). The
// record counts read the table: call it at a scrape's pace, not per
// request. Engine holds idem_pg_table_bytes (the table with its indexes
// and TOAST), the pool's connections, whether the listener is connected
// and the offset of the database server's clock from this replica's.
func (s *Store) Metrics(ctx context.Context) (idem.Metrics, error) {
	var m idem.Metrics
	if err := ctx.Err(); err != nil {
		return m, err
	}
	if err := s.enter(); err != nil {
		return m, err
	}
	// The counts come first: a sweep counts its records once their
	// deletion has committed, so a record counted here as swept is gone
	// from the table read below, and is never counted as expired too.
	m.Events = s.tally.Counts()
	m.BytesReclaimed = s.reclaimed.Load()
	now := s.now()
	var (
		oldest     *time.Time
		tableBytes int64
	)
	if err := s.db.QueryRow(ctx, s.sql.metrics, now, s.sql.keys).Scan(&m.InProgress, &m.Overdue, &oldest,
		&m.UnknownRecords, &m.FailedRecords, &m.Expired, &tableBytes); err != nil {
		return m, s.fail("metrics", err)
	}
	if oldest != nil {
		m.OldestInProgress = max(0, now.Sub(*oldest))
	}
	offset, err := s.clockOffset(ctx)
	if err != nil {
		return m, s.fail("metrics", err)
	}
	ps := s.pool.Stat()
	connected := 0.0
	if s.listener.listenerPID() != 0 {
		connected = 1
	}
	m.Engine = []idem.Figure{
		{Name: "idem_pg_table_bytes", Help: "Bytes of the idempotency_keys table with its indexes and TOAST.", Value: float64(tableBytes)},
		{Name: "idem_pg_pool_acquired_conns", Help: "Pool connections in use now.", Value: float64(ps.AcquiredConns())},
		{Name: "idem_pg_pool_total_conns", Help: "Pool connections open now.", Value: float64(ps.TotalConns())},
		{Name: "idem_pg_listener_connected", Help: "1 while the connection that wakes waiters is listening, else 0.", Value: connected},
		{Name: "idem_pg_clock_offset_seconds", Help: "How far the database server's clock is ahead of this replica's (negative: behind); keep it within half of ClockSkew.", Value: offset.Seconds()},
	}
	return m, nil
}
