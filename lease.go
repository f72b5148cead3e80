package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Lease is the right to run one claimed operation and record its outcome.
// Exactly one of Complete, Release, MarkUnknown or MarkFailed ends it;
// Extend keeps it alive during a long operation. Each call checks that the
// record is still this lease's: if a reconciler or an operator resolved or
// took over the record, the call fails with ErrLeaseLost and changes
// nothing.
//
// The context passed to each method is checked before any work starts. Pass
// one that outlives the client's request: an outcome that is not recorded
// leaves the record in progress until reconciliation.
//
// A Lease is safe for concurrent use, though its calls are serialized.
type Lease struct {
	db    *DB
	rk    []byte
	scope Scope

	start time.Time // when the lease was granted, from Options.Now

	mu     sync.Mutex
	rec    Record // guarded by mu: the record as this lease last wrote it
	val    []byte // guarded by mu: rec's stored value
	writes uint64 // guarded by mu: the stripe's write count after that write
}

// Record returns a copy of the record as this lease last wrote it; its
// State is zero once the lease released the key.
func (l *Lease) Record() Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

// Scope returns the scope the lease was claimed for.
func (l *Lease) Scope() Scope { return l.scope }

// Until returns when the lease runs out unless extended.
func (l *Lease) Until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.LeaseUntil
}

// Complete durably stores resp as the operation's outcome; every later
// claim with the same fingerprint replays it. Bodies beyond
// Options.MaxBodyBytes are not kept (Record.BodyOmitted).
func (l *Lease) Complete(ctx context.Context, resp Response) error {
	if resp.Status < 100 || resp.Status > 999 {
		return fmt.Errorf("%w: status %d is outside 100-999", ErrInvalidResponse, resp.Status)
	}
	return l.update(ctx, func(next *Record, now time.Time) []byte {
		body := resp.Body
		next.State = StateCompleted
		next.LeaseUntil = now
		next.Response = Response{Status: resp.Status, Header: resp.Header}
		next.BodyLen, next.BodyDigest = int64(len(body)), bodyDigest(body)
		switch {
		case len(body) <= l.db.opts.InlineBodyBytes:
			next.Response.Body = body
		case int64(len(body)) <= l.db.opts.MaxBodyBytes:
			return body
		default:
			next.BodyOmitted = true
		}
		return nil
	})
}

// Release deletes the claim: the operation provably did not commit, so the
// key is free and a retry runs the operation again.
func (l *Lease) Release(ctx context.Context) error {
	return l.update(ctx, nil)
}

// MarkUnknown records that the operation may have taken effect but its
// outcome is not known (a timeout after the request left, a crash in the
// middle). Later claims get ErrOutcomePending until someone resolves it;
// the operation is never run again blindly.
func (l *Lease) MarkUnknown(ctx context.Context) error {
	return l.end(ctx, StateUnknown)
}

// MarkFailed records that the operation is known not to have taken effect
// while keeping the key spent, for operations that must not simply be
// retried. Later claims get ErrOutcomePending.
func (l *Lease) MarkFailed(ctx context.Context) error {
	return l.end(ctx, StateFailed)
}

func (l *Lease) end(ctx context.Context, s State) error {
	return l.update(ctx, func(next *Record, now time.Time) []byte {
		next.State = s
		next.LeaseUntil = now
		return nil
	})
}

// Extend pushes the lease's end to Options.Lease from now.
func (l *Lease) Extend(ctx context.Context) error {
	return l.update(ctx, func(next *Record, now time.Time) []byte {
		next.LeaseUntil = now.Add(l.db.opts.Lease)
		return nil
	})
}

// update checks that the record is still this lease's and replaces it with
// what change makes of a copy, or deletes it when change is nil. change
// returns the overflow body to store in chunks, if any.
func (l *Lease) update(ctx context.Context, change func(next *Record, now time.Time) []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	db := l.db
	mu, err := db.begin(l.rk)
	if err != nil {
		return err
	}
	defer db.end(mu)
	now := db.now()
	// The record is still this lease's exactly when it is in progress and
	// its stored value is the one the lease last wrote: any other writer
	// changes the state or the token. When nothing at all was written under
	// the stripe since, that is certain without a read; otherwise compare
	// the stored bytes, which spares decoding.
	held := mu.writes == l.writes
	if !held {
		if held, err = db.holds(l.rk, l.val); err != nil {
			return err
		}
	}
	if !held || l.rec.State != StateInProgress || !now.Before(l.rec.ExpiresAt) {
		return ErrLeaseLost
	}
	cur := &l.rec
	if change == nil {
		if err := db.deleteLocked(l.rk, cur); err != nil {
			return err
		}
		db.stats.releases.Add(1)
		db.waiting.wake(l.rk)
		gone := *cur
		gone.State = 0 // the event reports the state after the transition
		db.event(EventReleased, l.scope, &gone, l.start)
		l.rec.State, l.val = 0, nil
		return nil
	}
	next := *cur
	next.Scope = l.scope
	next.UpdatedAt = now
	body := change(&next, now)
	v, err := db.writeLocked(l.rk, cur, &next, body)
	if err != nil {
		return err
	}
	if next.State != StateInProgress {
		db.waiting.wake(l.rk)
	}
	switch next.State {
	case StateCompleted:
		db.stats.completions.Add(1)
		db.event(EventCompleted, l.scope, &next, l.start)
	case StateUnknown:
		db.stats.unknowns.Add(1)
		db.event(EventUnknown, l.scope, &next, l.start)
	case StateFailed:
		db.stats.failures.Add(1)
		db.event(EventFailed, l.scope, &next, l.start)
	}
	l.rec, l.val, l.writes = next, v, mu.writes
	return nil
}

// holds reports whether the value stored under rk is exactly v. The caller
// holds rk's stripe.
func (db *DB) holds(rk, v []byte) (bool, error) {
	got, closer, err := db.get(rk)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idem: read record: %w", err)
	}
	defer closer.Close()
	return bytes.Equal(got, v), nil
}
