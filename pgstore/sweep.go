package pgstore

import (
	"context"
	"time"

	"github.com/idemkv/idem"
)

// sweepBatch bounds the rows one sweep statement deletes, so no statement
// holds many row locks or runs long.
const sweepBatch = 1000

// sweepSQL deletes up to $2 records expired by $1, found on the
// expires_at index and deleted by their row addresses. The outer
// condition on expires_at is checked again on the row as it is when
// locked, so a record a claim took over meanwhile is kept. Rows locked by
// a transaction still open, such as a ClaimTx taking over an expired
// record, are skipped rather than waited for. It returns what the events
// and the byte count need of each record, and no more.
const sweepSQL = `
DELETE FROM {keys}
WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM {keys} WHERE expires_at <= $1 LIMIT $2
	FOR UPDATE SKIP LOCKED))
	AND expires_at <= $1
RETURNING tenant, endpoint, idem_key, fingerprint, state, coalesce(response_status, 0), attempts,
	octet_length(tenant) + octet_length(endpoint) + octet_length(idem_key)
	+ coalesce(octet_length(response_body), 0) + coalesce(octet_length(response_headers::text), 0)`

// countExpiredSQL counts what a sweep is about to delete, for its progress.
const countExpiredSQL = `SELECT count(*) FROM {keys} WHERE expires_at <= $1`

// loop sweeps and reconciles every Options.SweepInterval until Close.
func (s *Store) loop() {
	defer close(s.loopDone)
	if s.opts.SweepInterval <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	tick := time.NewTicker(s.opts.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-tick.C:
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("pgstore: sweeping expired records failed; trying again later", "err", err)
		}
		if s.opts.Reconcile == nil {
			continue
		}
		if _, err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("pgstore: reconciling overdue claims failed; trying again later", "err", err)
		}
	}
}

// Sweep deletes every record that has expired by now, in batches of a
// thousand. One replica sweeps at a time: a Sweep that finds another
// replica sweeping (it holds the sweep advisory lock) returns at once
// with nothing done. Bytes are the bytes of the deleted scopes, headers
// and bodies.
func (s *Store) Sweep(ctx context.Context) (idem.SweepResult, error) {
	return s.sweep(ctx, nil)
}

// Compact is Sweep: PostgreSQL's autovacuum gives the space of deleted
// rows back to the table, and there is nothing else to compact. progress,
// when not nil, hears of the sweep phase after each batch.
func (s *Store) Compact(ctx context.Context, progress func(idem.CompactProgress)) (idem.SweepResult, error) {
	return s.sweep(ctx, progress)
}

func (s *Store) sweep(ctx context.Context, progress func(idem.CompactProgress)) (idem.SweepResult, error) {
	var res idem.SweepResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if err := s.enter(); err != nil {
		return res, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, s.fail("sweep", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lockSweep).Scan(&locked); err != nil {
		return res, s.fail("sweep", err)
	}
	if !locked {
		return res, nil
	}
	defer func() {
		if _, err := conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", lockSweep); err != nil {
			// A session lock that cannot be released must not go back to
			// the pool with the connection.
			conn.Conn().Close(context.Background())
		}
	}()
	now := s.now()
	var total int64
	if progress != nil {
		if err := conn.QueryRow(ctx, s.sql.countExpired, now).Scan(&total); err != nil {
			return res, s.fail("sweep", err)
		}
		progress(idem.CompactProgress{Phase: "sweep", Total: total})
	}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		rows, err := conn.Query(ctx, s.sql.sweep, now, sweepBatch)
		if err != nil {
			return res, s.fail("sweep", err)
		}
		// The batch's deletions commit when its statement ends, so its
		// records are counted and logged only then: a Metrics in between
		// must not count a record as swept and as expired at once.
		var swept []idem.Record
		var bytes int64
		for rows.Next() {
			var (
				rec           idem.Record
				fp            []byte
				state         int16
				status, tries int32
				size          int64
			)
			if err := rows.Scan(&rec.Scope.Tenant, &rec.Scope.Endpoint, &rec.Scope.Key, &fp, &state, &status, &tries, &size); err != nil {
				rows.Close()
				return res, s.fail("sweep", err)
			}
			copy(rec.Fingerprint[:], fp)
			rec.State, rec.Response.Status, rec.Attempts = idem.State(state), int(status), uint32(tries)
			swept = append(swept, rec)
			bytes += size
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return res, s.fail("sweep", err)
		}
		n := len(swept)
		res.Records += n
		res.Bytes += bytes
		s.reclaimed.Add(bytes)
		for i := range swept {
			s.note(idem.EventSwept, &swept[i], time.Time{})
		}
		if progress != nil {
			progress(idem.CompactProgress{Phase: "sweep", Done: int64(res.Records), Total: max(total, int64(res.Records))})
		}
		if n < sweepBatch {
			return res, nil
		}
	}
}
