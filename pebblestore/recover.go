package pebblestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
	"github.com/idemkv/idem/internal/rows"
)

// Overdue returns up to limit in-progress records whose lease has run out
// (limit <= 0: all of them), oldest lease first. Nobody is known to be
// working on them, and they are never re-executed on their own: they wait
// for Options.Reconcile or an operator. It reads the pending index, not the
// whole store.
func (db *Store) Overdue(ctx context.Context, limit int) ([]*idem.Record, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	now := db.now()
	var rks [][]byte
	err := db.rows.ScanPending(now.Add(1), func(e rows.Pending) bool {
		if e.State == idem.StateInProgress {
			rks = append(rks, e.RK)
		}
		return limit <= 0 || len(rks) < limit
	})
	if err != nil {
		return nil, err
	}
	var out []*idem.Record
	for _, rk := range rks {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		rec, err := db.lockedRead(rk, now)
		if err != nil {
			return out, err
		}
		if rec != nil && rec.State == idem.StateInProgress && !now.Before(rec.LeaseUntil) {
			out = append(out, &rec.Record)
		}
	}
	return out, nil
}

// lockedRead reads the live record under rk with its scope, taking the
// stripe; it returns nil if there is none.
func (db *Store) lockedRead(rk []byte, now time.Time) (*record.Stored, error) {
	mu := db.rows.Stripe(rk)
	mu.Lock()
	defer mu.Unlock()
	rec, live, err := db.rows.ReadLocked(rk, now)
	if err != nil || !live {
		return nil, err
	}
	rec.Scope.Tenant, rec.Scope.Endpoint, rec.Scope.Key, err = keys.ParseRecord(rk)
	return rec, err
}

// Reconcile hands every overdue in-progress record to Options.Reconcile.
// Each gets a fresh lease first (a new token, Attempts+1), so a holder that
// was only slow gets ErrLeaseLost instead of racing the reconciler, and a
// reconciler that gives up leaves the record to come due again one lease
// later. Without a reconciler the records are only counted and logged. The
// background loop calls Reconcile after each sweep.
func (db *Store) Reconcile(ctx context.Context) (idem.ReconcileResult, error) {
	var res idem.ReconcileResult
	overdue, err := db.Overdue(ctx, 0)
	if err != nil {
		return res, err
	}
	res.Overdue = len(overdue)
	for _, rec := range overdue {
		db.opts.Logger.Warn("idem: claim overdue; its outcome is unknown until reconciled",
			"tenant", rec.Scope.Tenant, "endpoint", rec.Scope.Endpoint, "key_hash", idem.KeyHash(rec.Scope.Key),
			"age", db.now().Sub(rec.CreatedAt), "attempts", rec.Attempts)
		if db.opts.Reconcile == nil {
			continue
		}
		l, err := db.takeOver(rec.Scope, overdueOnly)
		if errors.Is(err, errNotOverdue) || errors.Is(err, idem.ErrNotFound) {
			continue // resolved or expired since Overdue read it
		}
		if err != nil {
			return res, err
		}
		if err := db.opts.Reconcile(ctx, l); err != nil {
			db.opts.Logger.Warn("idem: reconciler failed", "tenant", rec.Scope.Tenant,
				"endpoint", rec.Scope.Endpoint, "key_hash", idem.KeyHash(rec.Scope.Key), "err", err)
			continue
		}
		if after := l.Record(); after.State != idem.StateInProgress {
			res.Resolved++
			db.note(idem.EventReconciled, rec.Scope, &after, l.start)
		}
	}
	return res, nil
}

var errNotOverdue = errors.New("idem: record is not overdue")

// TakeOver gives the caller a new lease (a new token, Attempts+1) on a
// record whose earlier attempt is stuck, as idem.Operator.TakeOver
// says: the operator's way out of ErrOutcomePending (idem resolve). It
// grants a lease as Claim does, and refuses with ErrClockBehind when Claim
// would.
func (db *Store) TakeOver(ctx context.Context, s idem.Scope) (idem.Lease, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l, err := db.takeOver(s, idem.CheckTakeOver)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// A takeover rule says whether a live record may get a new lease at now.
type takeoverRule func(rec *idem.Record, now time.Time) error

// overdueOnly admits in-progress records past their lease: what the
// reconciler looks at.
func overdueOnly(rec *idem.Record, now time.Time) error {
	if rec.State != idem.StateInProgress || now.Before(rec.LeaseUntil) {
		return errNotOverdue
	}
	return nil
}

// takeOver gives the record of s a new lease (a new token, Attempts+1) if
// rule admits it.
func (db *Store) takeOver(s idem.Scope, rule takeoverRule) (*lease, error) {
	start := db.opts.Now()
	rk := recordKey(s)
	mu, err := db.begin(rk)
	if err != nil {
		return nil, err
	}
	defer db.end(mu)
	now := db.now()
	if err := db.checkClock(s, idem.Fingerprint{}, now, start); err != nil {
		return nil, err
	}
	cur, live, err := db.rows.ReadLocked(rk, now)
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, idem.ErrNotFound
	}
	cur.Scope = s
	if err := rule(&cur.Record, now); err != nil {
		return nil, err
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("idem: lease token: %w", err)
	}
	next := *cur
	next.Scope = s
	next.Token = token
	next.State = idem.StateInProgress
	next.UpdatedAt = now
	next.LeaseUntil = now.Add(db.opts.Lease)
	next.Attempts++
	v, err := db.rows.WriteLocked(rk, cur, &next, nil)
	if err != nil {
		return nil, err
	}
	db.note(idem.EventTakenOver, s, &next.Record, time.Time{})
	return &lease{db: db, rk: rk, scope: s, rec: next, val: v, writes: mu.Writes, start: start}, nil
}
