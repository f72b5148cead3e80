package pebblestore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/idemkv/idem"
)

// waiters lets callers sleep until an in-progress record is resolved.
// Every lease of this store lives in this process, so the lease's own end
// can wake them: no polling.
type waiters struct {
	n  atomic.Int64 // registered waiters, so that ends skip the lock when none
	mu sync.Mutex
	by map[string][]chan struct{} // guarded by mu, keyed by record key
}

// add registers a wake-up for rk. The caller holds rk's stripe, so no end
// of the lease can come between its read of the record and this call.
func (w *waiters) add(rk []byte) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil {
		w.by = map[string][]chan struct{}{}
	}
	w.by[string(rk)] = append(w.by[string(rk)], ch)
	w.n.Add(1)
	return ch
}

// wake wakes everyone waiting on rk. The caller holds rk's stripe.
func (w *waiters) wake(rk []byte) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	chs := w.by[string(rk)]
	delete(w.by, string(rk))
	for _, ch := range chs {
		close(ch)
	}
	w.n.Add(-int64(len(chs)))
}

// wakeAll wakes every waiter, when the store closes.
func (w *waiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for rk, chs := range w.by {
		for _, ch := range chs {
			close(ch)
		}
		w.n.Add(-int64(len(chs)))
		delete(w.by, rk)
	}
}

// drop forgets a wake-up that is no longer wanted.
func (w *waiters) drop(rk []byte, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	chs := w.by[string(rk)]
	for i, c := range chs {
		if c == ch {
			w.by[string(rk)] = append(chs[:i], chs[i+1:]...)
			if len(w.by[string(rk)]) == 0 {
				delete(w.by, string(rk))
			}
			w.n.Add(-1)
			return
		}
	}
}

// Wait blocks until the record for s is no longer in progress under a live
// lease (completed, released, marked, or overdue), or until ctx is done,
// and returns ctx's error in that case. Close wakes every waiter. A caller that got ErrInProgress
// can Wait briefly and claim again, instead of polling.
func (db *Store) Wait(ctx context.Context, s idem.Scope) error {
	if err := s.Validate(); err != nil {
		return err
	}
	rk := recordKey(s)
	mu, err := db.begin(rk)
	if err != nil {
		return err
	}
	now := db.now()
	rec, live, err := db.rows.ReadLocked(rk, now)
	if err != nil || !live || rec.State != idem.StateInProgress || !now.Before(rec.LeaseUntil) {
		db.end(mu)
		return err
	}
	ch := db.waiting.add(rk)
	// Close must not wait for sleepers: leave the operation before waiting.
	db.end(mu)
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		db.waiting.drop(rk, ch)
		return ctx.Err()
	}
}
