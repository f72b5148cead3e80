package pgstore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkv/idem"
)

// listPage is how many records Records reads per query. Between pages it
// holds no connection, so the caller's loop may use the store.
const listPage = 100

const listSQL = `SELECT ` + listColumns + ` FROM {keys}
WHERE (tenant, endpoint, idem_key) > ($1, $2, $3)
	AND ($4 = '' OR tenant = $4) AND ($5 = '' OR endpoint = $5) AND ($6 = 0 OR state = $6)
	AND ($7::timestamptz IS NULL OR created_at < $7)
	AND ($8 OR expires_at > $9)
ORDER BY tenant, endpoint, idem_key
LIMIT $10`

// Records returns the records f selects, as idem.Operator.Records
// says, ordered by tenant, endpoint and key, byte by byte. Bodies over 64 KiB are left
// out (Body nil, BodyLen set); Get returns them. The listing is read a
// page at a time, so it is not one snapshot: a record changed during the
// loop may be seen before or after the change.
func (s *Store) Records(ctx context.Context, f idem.Filter) iter.Seq2[*idem.Record, error] {
	return func(yield func(*idem.Record, error) bool) {
		// Each page starts after the last scope of the one before. Every
		// scope sorts after the zero Scope, which cannot be stored: its key
		// is empty.
		var after idem.Scope
		for {
			if err := ctx.Err(); err != nil {
				yield(nil, err)
				return
			}
			if err := s.enter(); err != nil {
				yield(nil, err)
				return
			}
			now := s.now()
			var before any
			if !f.CreatedBefore.IsZero() {
				// The database keeps microseconds; Match below has the
				// last word.
				before = f.CreatedBefore.Add(time.Microsecond)
			}
			rows, err := s.db.Query(ctx, s.sql.list, after.Tenant, after.Endpoint, after.Key,
				f.Tenant, f.Endpoint, int16(f.State), before, f.Expired, now, listPage)
			if err != nil {
				yield(nil, s.fail("records", err))
				return
			}
			var page []*idem.Record
			for rows.Next() {
				r, err := scanRecord(rows)
				if err != nil {
					rows.Close()
					yield(nil, s.fail("records", err))
					return
				}
				page = append(page, &r.rec)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				yield(nil, s.fail("records", err))
				return
			}
			for _, rec := range page {
				if f.Match(rec, now) && !yield(rec, nil) {
					return
				}
			}
			if len(page) < listPage {
				return
			}
			after = page[len(page)-1].Scope
		}
	}
}

const overdueSQL = `SELECT ` + columns + ` FROM {keys}
WHERE state = 1 AND lease_until <= $1 AND expires_at > $1
ORDER BY lease_until, tenant, endpoint, idem_key
LIMIT $2`

// Overdue returns up to limit in-progress records whose lease has run out
// (limit <= 0: all), oldest lease first.
func (s *Store) Overdue(ctx context.Context, limit int) ([]*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	var lim any
	if limit > 0 {
		lim = limit
	}
	rows, err := s.db.Query(ctx, s.sql.overdue, s.now(), lim)
	if err != nil {
		return nil, s.fail("overdue", err)
	}
	defer rows.Close()
	var out []*idem.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, s.fail("overdue", err)
		}
		out = append(out, &r.rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail("overdue", err)
	}
	return out, nil
}

// takeOverSQL grants a new lease ($4 token, $6 its end) on a record that
// is unknown, failed, or in progress past its lease, and announces it
// when the record says someone waits.
const takeOverSQL = `
WITH u AS (
	UPDATE {keys} SET state = 1, lease_token = $4, lease_until = $6,
		attempts = attempts + 1, updated_at = $5
	WHERE tenant = $1 AND endpoint = $2 AND idem_key = $3 AND expires_at > $5
		AND (state IN (3, 4) OR (state = 1 AND lease_until <= $5))
	RETURNING ` + columns + `, waiting
)
SELECT u.*, CASE WHEN u.waiting THEN pg_notify($7, $8) END FROM u`

// TakeOver gives the caller a new lease on a stuck record, as
// idem.Operator.TakeOver says.
func (s *Store) TakeOver(ctx context.Context, sc idem.Scope) (idem.Lease, error) {
	if err := validate(sc); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	for range claimRetries {
		now := s.now()
		token := newToken()
		r, err := scanRecord(s.db.QueryRow(ctx, s.sql.takeOver, sc.Tenant, sc.Endpoint, sc.Key, token, now,
			s.leaseEnd(now), notifyChannel, scopeTag(sc)), new(bool), nil)
		if err == nil {
			s.note(idem.EventTakenOver, &r.rec, time.Time{})
			return &lease{s: s, q: s.db, scope: sc, token: r.token, start: now, rec: r.rec}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, s.fail("take-over", err)
		}
		// Say why not from the record as it is now.
		r, err = scanRecord(s.db.QueryRow(ctx, s.sql.get, sc.Tenant, sc.Endpoint, sc.Key, now))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil, idem.ErrNotFound
		case err != nil:
			return nil, s.fail("take-over", err)
		}
		if err := idem.CheckTakeOver(&r.rec, now); err != nil {
			return nil, err
		}
		// The record became stuck between the two statements: try again.
	}
	return nil, fmt.Errorf("pgstore: take-over: the record kept changing under %d attempts", claimRetries)
}

// reconcilePickSQL picks one overdue record that no other replica is
// taking right now (SKIP LOCKED) and grants it a new lease ($2 token, $3
// its end, $4 now), so two reconcilers never get the same record.
const reconcilePickSQL = `
WITH c AS (
	SELECT tenant, endpoint, idem_key FROM {keys}
	WHERE state = 1 AND lease_until <= $1 AND expires_at > $1
	ORDER BY lease_until
	LIMIT 1
	FOR UPDATE SKIP LOCKED
)
UPDATE {keys} k SET lease_token = $2, lease_until = $3,
	attempts = k.attempts + 1, updated_at = $4
FROM c
WHERE k.tenant = c.tenant AND k.endpoint = c.endpoint AND k.idem_key = c.idem_key
RETURNING k.tenant, k.endpoint, k.idem_key, k.fingerprint, k.state, k.response_status,
	k.response_headers, k.response_body, k.body_len, k.body_digest, k.body_omitted,
	k.lease_token, k.lease_until, k.attempts, k.created_at, k.updated_at, k.expires_at, k.waiting`

const countOverdueSQL = `SELECT count(*) FROM {keys}
WHERE state = 1 AND lease_until <= $1 AND expires_at > $1`

// Reconcile hands overdue records to Options.Reconcile, each under a
// fresh lease (a new token, Attempts+1), so a holder that was only slow
// gets ErrLeaseLost instead of racing the reconciler. Records are taken
// one at a time with FOR UPDATE SKIP LOCKED: replicas reconciling at once
// share the work and never hand the same record to two reconcilers.
// Overdue counts the records this call took; a reconciler's error leaves
// its record to come due again one lease later. Without a reconciler the
// overdue records are only counted.
func (s *Store) Reconcile(ctx context.Context) (idem.ReconcileResult, error) {
	var res idem.ReconcileResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if err := s.enter(); err != nil {
		return res, err
	}
	// A record is overdue if it was at the start of the pass: one taken
	// in the pass leases past that, so the pass ends even when every
	// reconciler fails.
	now := s.now()
	if s.opts.Reconcile == nil {
		var n int64
		if err := s.db.QueryRow(ctx, s.sql.countOverdue, now).Scan(&n); err != nil {
			return res, s.fail("reconcile", err)
		}
		res.Overdue = int(n)
		if n > 0 {
			s.opts.Logger.Warn("pgstore: claims overdue and no reconciler; their outcome is unknown until resolved", "overdue", n)
		}
		return res, nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		l, err := s.takeOverdue(ctx, now)
		if errors.Is(err, pgx.ErrNoRows) {
			return res, nil
		}
		if err != nil {
			return res, s.fail("reconcile", err)
		}
		res.Overdue++
		rec := l.Record()
		if err := s.opts.Reconcile(ctx, l); err != nil {
			s.opts.Logger.Warn("pgstore: reconciler failed", "tenant", rec.Scope.Tenant,
				"endpoint", rec.Scope.Endpoint, "key_hash", idem.KeyHash(rec.Scope.Key), "err", err)
			continue
		}
		if after := l.Record(); after.State != idem.StateInProgress {
			res.Resolved++
			s.note(idem.EventReconciled, &after, l.start)
		}
	}
}

// takeOverdue takes one record overdue at pass for this reconciler, or
// returns pgx.ErrNoRows when none is left that another replica is not
// taking. Its new lease runs from now, not from the start of the pass.
func (s *Store) takeOverdue(ctx context.Context, pass time.Time) (*lease, error) {
	// The notification needs the scope's tag, which is known only once
	// the row is picked; so pick and take over in a transaction, then
	// notify before it commits, if the record says someone waits.
	var out *lease
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		now := s.now()
		if now.Before(pass) {
			now = pass // a clock set back must not end the lease before pass
		}
		var waiting bool
		r, err := scanRecord(tx.QueryRow(ctx, s.sql.reconcilePick, pass, newToken(), s.leaseEnd(now), now), &waiting)
		if err != nil {
			return err
		}
		if waiting {
			if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", notifyChannel, scopeTag(r.rec.Scope)); err != nil {
				return err
			}
		}
		out = &lease{s: s, q: s.db, scope: r.rec.Scope, token: r.token, start: now, rec: r.rec}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.note(idem.EventTakenOver, &out.rec, time.Time{})
	return out, nil
}
