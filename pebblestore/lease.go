package pebblestore

import (
	"context"
	"sync"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/record"
)

// lease is the embedded store's Lease: its calls check, under the
// record's stripe, that the stored value is still the one it wrote.
type lease struct {
	db    *Store
	rk    []byte
	scope idem.Scope

	start time.Time // when the lease was granted, from Options.Now

	mu     sync.Mutex
	rec    record.Stored // guarded by mu: the record as this lease last wrote it
	val    []byte        // guarded by mu: rec's stored value
	writes uint64        // guarded by mu: the stripe's write count after that write
}

func (l *lease) Record() idem.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Record
}

func (l *lease) Scope() idem.Scope { return l.scope }

// Complete keeps bodies up to Options.InlineBodyBytes inside the record,
// larger ones up to Options.MaxBodyBytes in chunks beside it, and omits
// larger ones.
func (l *lease) Complete(ctx context.Context, resp idem.Response) error {
	if err := resp.Check(); err != nil {
		return err
	}
	return l.update(ctx, func(next *record.Stored, now time.Time) []byte {
		body := resp.Body
		next.State = idem.StateCompleted
		next.LeaseUntil = now
		next.Response = idem.Response{Status: resp.Status, Header: resp.Header}
		next.BodyLen, next.BodyDigest = int64(len(body)), record.BodyDigest(body)
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

func (l *lease) Release(ctx context.Context) error {
	return l.update(ctx, nil)
}

func (l *lease) MarkUnknown(ctx context.Context) error {
	return l.end(ctx, idem.StateUnknown)
}

func (l *lease) MarkFailed(ctx context.Context) error {
	return l.end(ctx, idem.StateFailed)
}

func (l *lease) end(ctx context.Context, s idem.State) error {
	return l.update(ctx, func(next *record.Stored, now time.Time) []byte {
		next.State = s
		next.LeaseUntil = now
		return nil
	})
}

// Extend pushes the lease's end to Options.Lease from now. It never moves
// the end back, which a clock stepped back would otherwise do: the record
// would come due for reconciliation while its holder still works.
func (l *lease) Extend(ctx context.Context) error {
	return l.update(ctx, func(next *record.Stored, now time.Time) []byte {
		if end := now.Add(l.db.opts.Lease); end.After(next.LeaseUntil) {
			next.LeaseUntil = end
		}
		return nil
	})
}

// update checks that the record is still this lease's and replaces it with
// what change makes of a copy, or deletes it when change is nil. change
// returns the overflow body to store in chunks, if any.
func (l *lease) update(ctx context.Context, change func(next *record.Stored, now time.Time) []byte) error {
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
	held := mu.Writes == l.writes
	if !held {
		if held, err = db.rows.HoldsLocked(l.rk, l.val); err != nil {
			return err
		}
	}
	if !held || l.rec.State != idem.StateInProgress || !now.Before(l.rec.ExpiresAt) {
		return idem.ErrLeaseLost
	}
	cur := &l.rec
	if change == nil {
		if err := db.rows.DeleteLocked(l.rk, cur); err != nil {
			return err
		}
		db.waiting.wake(l.rk)
		gone := cur.Record
		gone.State = 0 // the event reports the state after the transition
		db.note(idem.EventReleased, l.scope, &gone, l.start)
		l.rec.State, l.val = 0, nil
		return nil
	}
	db.clock.observe(now.UnixNano())
	next := *cur
	next.Scope = l.scope
	next.UpdatedAt = now
	body := change(&next, now)
	v, err := db.rows.WriteLocked(l.rk, cur, &next, body)
	if err != nil {
		return err
	}
	if next.State != idem.StateInProgress {
		db.waiting.wake(l.rk)
	}
	switch next.State {
	case idem.StateCompleted:
		db.note(idem.EventCompleted, l.scope, &next.Record, l.start)
	case idem.StateUnknown:
		db.note(idem.EventUnknown, l.scope, &next.Record, l.start)
	case idem.StateFailed:
		db.note(idem.EventFailed, l.scope, &next.Record, l.start)
	}
	l.rec, l.val, l.writes = next, v, mu.Writes
	return nil
}
