package idemtest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/idemkv/idem"
)

// MemOptions configure a MemStore. They mirror the options of pebblestore.Open
// that mean something without a disk. The zero value of each field selects
// its default; a nil *MemOptions selects every default.
type MemOptions struct {
	// Now is the clock; pass a Clock's Now to move time by hand.
	// Default: time.Now.
	Now func() time.Time

	// Lease is how long a claim is held before it counts as abandoned.
	// Default: 30 seconds (idem.DefaultLease).
	Lease time.Duration

	// TTL is how long a record is kept after it is claimed: at least
	// idem.MinTTLLeases leases, as in every store. Default: 24 hours
	// (idem.DefaultTTL).
	TTL time.Duration

	// EndpointTTL overrides TTL for the endpoints it names. Default: none.
	EndpointTTL map[string]time.Duration

	// MaxBodyBytes is the largest response body kept. A larger one is
	// dropped: the record keeps its length and digest and says
	// BodyOmitted. Default: 4 MiB, as pebblestore.Open.
	MaxBodyBytes int64

	// Reconcile is handed each overdue record, under a fresh lease, by
	// MemStore.Reconcile; see pebblestore.Options.Reconcile. Default: none.
	Reconcile func(ctx context.Context, l idem.Lease) error

	// ReconcileEvery is how often the test calls Reconcile, since a
	// MemStore runs no loop of its own. With a Reconcile, a claim of an
	// overdue record says that a reconciler is at work
	// (idem.KeyError.Reconciling), with this period as its RetryAfter, as
	// the real stores say of their loop. Default: 0, no reconciler at
	// work.
	ReconcileEvery time.Duration
}

// MemStore is an in-memory idem.Operator with the semantics of the
// embedded store (*pebblestore.Store): the same refusals, lease rules, expiry and
// counters, without Pebble or a filesystem. It is for tests of code built
// on the contract, such as HTTP handlers, and passes TestStore. Nothing
// survives the process, and every record is held in memory in full.
//
// The zero value is not usable; use NewMemStore. A MemStore is safe for
// concurrent use. Records it returns are copies the caller owns.
type MemStore struct {
	opts MemOptions

	// mu guards everything below, and the record each lease last wrote.
	mu      sync.Mutex
	closed  bool
	recs    map[idem.Scope]*memRecord
	waiters map[idem.Scope][]chan struct{}
	tokens  uint64       // the last lease token handed out
	stats   idem.Metrics // the event counts since NewMemStore
}

// memRecord is one stored record and the token of the lease that may
// change it. Every grant of a lease takes a new token, so a holder whose
// record was taken over, released and claimed again, or replaced after it
// expired, no longer matches.
type memRecord struct {
	rec   idem.Record
	token uint64
}

var (
	_ idem.Operator = (*MemStore)(nil)
	_ idem.Sizer    = (*MemStore)(nil)
)

// NewMemStore returns an empty store. It validates opts as the real
// stores do: its error lists every bad field and matches
// idem.ErrInvalidOptions.
func NewMemStore(opts *MemOptions) (*MemStore, error) {
	var o MemOptions
	if opts != nil {
		o = *opts
	}
	o.EndpointTTL = maps.Clone(o.EndpointTTL)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Lease == 0 {
		o.Lease = idem.DefaultLease
	}
	if o.TTL == 0 {
		o.TTL = idem.DefaultTTL
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = idem.DefaultMaxBodyBytes
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: idemtest: "+format, append([]any{idem.ErrInvalidOptions}, args...)...))
	}
	if o.Lease < 0 {
		bad("Lease %s must be positive", o.Lease)
	}
	if err := idem.CheckTTLs(o.TTL, o.EndpointTTL, o.Lease); err != nil {
		errs = append(errs, err)
	}
	if o.MaxBodyBytes < 0 {
		bad("MaxBodyBytes %d is negative", o.MaxBodyBytes)
	}
	if o.ReconcileEvery < 0 {
		bad("ReconcileEvery %s is negative", o.ReconcileEvery)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &MemStore{opts: o, recs: map[idem.Scope]*memRecord{}, waiters: map[idem.Scope][]chan struct{}{}}, nil
}

// now reads the clock without its monotonic reading, so that times stored
// in records compare equal with ==.
func (m *MemStore) now() time.Time { return m.opts.Now().Round(0) }

func (m *MemStore) ttlFor(endpoint string) time.Duration {
	if ttl, ok := m.opts.EndpointTTL[endpoint]; ok {
		return ttl
	}
	return m.opts.TTL
}

// enterLocked reports ErrClosed once Close has run.
func (m *MemStore) enterLocked() error {
	if m.closed {
		return idem.ErrClosed
	}
	return nil
}

// liveLocked returns the unexpired record of s, or nil.
func (m *MemStore) liveLocked(s idem.Scope, now time.Time) *memRecord {
	r := m.recs[s]
	if r == nil || !now.Before(r.rec.ExpiresAt) {
		return nil
	}
	return r
}

// Claim tries to take the key in s, as idem.Store.Claim says.
func (m *MemStore) Claim(ctx context.Context, s idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	if err := s.Validate(); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return nil, nil, err
	}
	now := m.now()
	if r := m.liveLocked(s, now); r != nil {
		rec, err := m.answerLocked(r, fp, now)
		return nil, rec, err
	}
	m.tokens++
	r := &memRecord{token: m.tokens, rec: idem.Record{
		Scope:       s,
		Fingerprint: fp,
		State:       idem.StateInProgress,
		CreatedAt:   now,
		UpdatedAt:   now,
		ExpiresAt:   now.Add(m.ttlFor(s.Endpoint)),
		LeaseUntil:  now.Add(m.opts.Lease),
		Attempts:    1,
	}}
	m.recs[s] = r
	m.stats.Events[idem.EventClaimed]++
	return &memLease{m: m, scope: s, token: r.token, rec: r.rec}, nil, nil
}

// answerLocked answers a claim of the live record r as idem.Decide says.
func (m *MemStore) answerLocked(r *memRecord, fp idem.Fingerprint, now time.Time) (*idem.Record, error) {
	every := m.opts.ReconcileEvery
	if m.opts.Reconcile == nil {
		every = 0
	}
	event, err := idem.Decide(&r.rec, fp, now, every)
	m.stats.Events[event]++
	if err != nil {
		return nil, err
	}
	rec := cloneRecord(r.rec)
	return &rec, nil
}

// Get returns the live record for s, as idem.Store.Get says.
func (m *MemStore) Get(ctx context.Context, s idem.Scope) (*idem.Record, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return nil, err
	}
	r := m.liveLocked(s, m.now())
	if r == nil {
		return nil, idem.ErrNotFound
	}
	rec := cloneRecord(r.rec)
	return &rec, nil
}

// Wait blocks while s is in progress under a live lease, as
// idem.Store.Wait says. Every end of a lease, a take-over and Close
// wake it; a lease that merely runs out does not, since the store keeps
// no timers.
func (m *MemStore) Wait(ctx context.Context, s idem.Scope) error {
	if err := s.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	if err := m.enterLocked(); err != nil {
		m.mu.Unlock()
		return err
	}
	now := m.now()
	r := m.liveLocked(s, now)
	if r == nil || r.rec.State != idem.StateInProgress || !now.Before(r.rec.LeaseUntil) {
		m.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	m.waiters[s] = append(m.waiters[s], ch)
	m.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		m.mu.Lock()
		defer m.mu.Unlock()
		if i := slices.Index(m.waiters[s], ch); i >= 0 {
			m.waiters[s] = slices.Delete(m.waiters[s], i, i+1)
			if len(m.waiters[s]) == 0 {
				delete(m.waiters, s)
			}
		}
		return ctx.Err()
	}
}

// wakeLocked wakes everyone waiting on s.
func (m *MemStore) wakeLocked(s idem.Scope) {
	for _, ch := range m.waiters[s] {
		close(ch)
	}
	delete(m.waiters, s)
}

// Ping fails only once the store is closed.
func (m *MemStore) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.enterLocked()
}

// Close wakes every waiter and makes every later call, leases' included,
// fail with ErrClosed. It always returns nil.
func (m *MemStore) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		for s := range m.waiters {
			m.wakeLocked(s)
		}
	}
	return nil
}

// Records returns the records f selects, as idem.Operator.Records
// says, ordered by tenant, endpoint and key, with their bodies. It reads
// a snapshot taken when the loop starts, so the loop may call the store.
func (m *MemStore) Records(ctx context.Context, f idem.Filter) iter.Seq2[*idem.Record, error] {
	return func(yield func(*idem.Record, error) bool) {
		m.mu.Lock()
		if err := m.enterLocked(); err != nil {
			m.mu.Unlock()
			yield(nil, err)
			return
		}
		now := m.now()
		var recs []*idem.Record
		for _, r := range m.recs {
			if f.Match(&r.rec, now) {
				rec := cloneRecord(r.rec)
				recs = append(recs, &rec)
			}
		}
		m.mu.Unlock()
		slices.SortFunc(recs, func(a, b *idem.Record) int { return compareScopes(a.Scope, b.Scope) })
		for _, rec := range recs {
			if err := ctx.Err(); err != nil {
				yield(nil, err)
				return
			}
			if !yield(rec, nil) {
				return
			}
		}
	}
}

func compareScopes(a, b idem.Scope) int {
	return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Key, b.Key))
}

// Overdue returns up to limit in-progress records whose lease has run out
// (limit <= 0: all), oldest lease first.
func (m *MemStore) Overdue(ctx context.Context, limit int) ([]*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return nil, err
	}
	now := m.now()
	var out []*idem.Record
	for _, r := range m.recs {
		if now.Before(r.rec.ExpiresAt) && r.rec.State == idem.StateInProgress && !now.Before(r.rec.LeaseUntil) {
			rec := cloneRecord(r.rec)
			out = append(out, &rec)
		}
	}
	slices.SortFunc(out, func(a, b *idem.Record) int {
		return cmp.Or(a.LeaseUntil.Compare(b.LeaseUntil), compareScopes(a.Scope, b.Scope))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// errNotOverdue tells Reconcile that a record left the overdue state
// between its listing and its take-over.
var errNotOverdue = errors.New("idemtest: record is not overdue")

// TakeOver gives the caller a new lease on a stuck record, as
// idem.Operator.TakeOver says.
func (m *MemStore) TakeOver(ctx context.Context, s idem.Scope) (idem.Lease, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l, err := m.takeOver(s, false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// takeOver grants a new lease on the record of s: when overdueOnly, only
// to an in-progress record past its lease (what the reconciler gets);
// otherwise to any record that is neither completed nor held.
func (m *MemStore) takeOver(s idem.Scope, overdueOnly bool) (*memLease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return nil, err
	}
	now := m.now()
	r := m.liveLocked(s, now)
	if r == nil {
		return nil, idem.ErrNotFound
	}
	if overdueOnly && (r.rec.State != idem.StateInProgress || now.Before(r.rec.LeaseUntil)) {
		return nil, errNotOverdue
	}
	if err := idem.CheckTakeOver(&r.rec, now); err != nil {
		return nil, err
	}
	m.tokens++
	r.token = m.tokens
	r.rec.State = idem.StateInProgress
	r.rec.UpdatedAt = now
	r.rec.LeaseUntil = now.Add(m.opts.Lease)
	r.rec.Attempts++
	m.stats.Events[idem.EventTakenOver]++
	m.wakeLocked(s)
	return &memLease{m: m, scope: s, token: r.token, rec: cloneRecord(r.rec)}, nil
}

// Reconcile hands every overdue record to MemOptions.Reconcile, each under
// a fresh lease, as idem's DB.Reconcile does. A reconciler's error leaves
// its record for the next pass; without a reconciler the records are only
// counted.
func (m *MemStore) Reconcile(ctx context.Context) (idem.ReconcileResult, error) {
	var res idem.ReconcileResult
	overdue, err := m.Overdue(ctx, 0)
	if err != nil {
		return res, err
	}
	res.Overdue = len(overdue)
	if m.opts.Reconcile == nil {
		return res, nil
	}
	for _, rec := range overdue {
		l, err := m.takeOver(rec.Scope, true)
		if errors.Is(err, errNotOverdue) || errors.Is(err, idem.ErrNotFound) {
			continue // resolved or expired since Overdue listed it
		}
		if err != nil {
			return res, err
		}
		if err := m.opts.Reconcile(ctx, l); err != nil {
			continue
		}
		if l.Record().State != idem.StateInProgress {
			res.Resolved++
			m.mu.Lock()
			m.stats.Events[idem.EventReconciled]++
			m.mu.Unlock()
		}
	}
	return res, nil
}

// Sweep deletes every record that has expired by now. Its Bytes are the
// bytes of the deleted records' scopes, headers and bodies.
func (m *MemStore) Sweep(ctx context.Context) (idem.SweepResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.SweepResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return idem.SweepResult{}, err
	}
	return m.sweepLocked(m.now()), nil
}

func (m *MemStore) sweepLocked(now time.Time) idem.SweepResult {
	var res idem.SweepResult
	for s, r := range m.recs {
		if now.Before(r.rec.ExpiresAt) {
			continue
		}
		delete(m.recs, s)
		res.Records++
		res.Bytes += recordBytes(&r.rec)
	}
	m.stats.Events[idem.EventSwept] += int64(res.Records)
	m.stats.BytesReclaimed += res.Bytes
	return res
}

// recordBytes is what a record holds beyond its fixed fields.
func recordBytes(rec *idem.Record) int64 {
	n := len(rec.Scope.Tenant) + len(rec.Scope.Endpoint) + len(rec.Scope.Key) + len(rec.Response.Body)
	for k, vs := range rec.Response.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return int64(n)
}

// Compact is Sweep: memory has no space to give back. progress, when not
// nil, hears of the sweep phase only, before and after it.
func (m *MemStore) Compact(ctx context.Context, progress func(idem.CompactProgress)) (idem.SweepResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.SweepResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return idem.SweepResult{}, err
	}
	now := m.now()
	var total int64
	for _, r := range m.recs {
		if !now.Before(r.rec.ExpiresAt) {
			total++
		}
	}
	if progress != nil {
		progress(idem.CompactProgress{Phase: "sweep", Total: total})
	}
	res := m.sweepLocked(now)
	if progress != nil {
		progress(idem.CompactProgress{Phase: "sweep", Done: int64(res.Records), Total: total})
	}
	return res, nil
}

// Size is what the records hold beyond their fixed fields, as Sweep counts
// them; memory has no disk, so FreeBytes is -1.
func (m *MemStore) Size(ctx context.Context) (idem.StoreSize, error) {
	if err := ctx.Err(); err != nil {
		return idem.StoreSize{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return idem.StoreSize{}, err
	}
	sz := idem.StoreSize{FreeBytes: -1}
	for _, r := range m.recs {
		sz.Bytes += recordBytes(&r.rec)
	}
	return sz, nil
}

// Metrics returns the event counts since NewMemStore and the stored
// records that are not completed, expired ones included until a sweep
// deletes them, as *pebblestore.Store counts them. Engine is empty.
func (m *MemStore) Metrics(ctx context.Context) (idem.Metrics, error) {
	if err := ctx.Err(); err != nil {
		return idem.Metrics{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return idem.Metrics{}, err
	}
	now := m.now()
	out := m.stats
	for _, r := range m.recs {
		switch r.rec.State {
		case idem.StateInProgress:
			out.InProgress++
			if !now.Before(r.rec.LeaseUntil) {
				out.Overdue++
			}
			out.OldestInProgress = max(out.OldestInProgress, now.Sub(r.rec.CreatedAt))
		case idem.StateUnknown:
			out.UnknownRecords++
		case idem.StateFailed:
			out.FailedRecords++
		}
		if !now.Before(r.rec.ExpiresAt) {
			out.Expired++
		}
	}
	return out, nil
}

// memLease is a MemStore's Lease. Its calls hold the store's mutex, which
// also guards rec.
type memLease struct {
	m     *MemStore
	scope idem.Scope
	token uint64
	rec   idem.Record // the record as this lease last wrote it
}

func (l *memLease) Scope() idem.Scope { return l.scope }

func (l *memLease) Record() idem.Record {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return cloneRecord(l.rec)
}

// Complete keeps bodies up to MemOptions.MaxBodyBytes and omits larger
// ones.
func (l *memLease) Complete(ctx context.Context, resp idem.Response) error {
	if err := resp.Check(); err != nil {
		return err
	}
	return l.update(ctx, func(rec *idem.Record, now time.Time) {
		rec.State = idem.StateCompleted
		rec.LeaseUntil = now
		rec.Response = idem.Response{Status: resp.Status, Header: cloneHeader(resp.Header)}
		rec.BodyLen, rec.BodyDigest = int64(len(resp.Body)), sha256.Sum256(resp.Body)
		if rec.BodyLen <= l.m.opts.MaxBodyBytes {
			rec.Response.Body = bytes.Clone(resp.Body)
		} else {
			rec.BodyOmitted = true
		}
		l.m.stats.Events[idem.EventCompleted]++
	})
}

func (l *memLease) Release(ctx context.Context) error { return l.update(ctx, nil) }

func (l *memLease) MarkUnknown(ctx context.Context) error {
	return l.update(ctx, func(rec *idem.Record, now time.Time) {
		rec.State, rec.LeaseUntil = idem.StateUnknown, now
		l.m.stats.Events[idem.EventUnknown]++
	})
}

func (l *memLease) MarkFailed(ctx context.Context) error {
	return l.update(ctx, func(rec *idem.Record, now time.Time) {
		rec.State, rec.LeaseUntil = idem.StateFailed, now
		l.m.stats.Events[idem.EventFailed]++
	})
}

func (l *memLease) Extend(ctx context.Context) error {
	return l.update(ctx, func(rec *idem.Record, now time.Time) {
		rec.LeaseUntil = now.Add(l.m.opts.Lease)
	})
}

// update checks that the record is still this lease's, then applies change
// to it, or deletes it when change is nil. The record is this lease's while
// it is in progress, unexpired and under the lease's token: every other
// writer changes the token or the state.
func (l *memLease) update(ctx context.Context, change func(rec *idem.Record, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enterLocked(); err != nil {
		return err
	}
	now := m.now()
	r := m.liveLocked(l.scope, now)
	if r == nil || r.token != l.token || r.rec.State != idem.StateInProgress {
		return idem.ErrLeaseLost
	}
	if change == nil {
		delete(m.recs, l.scope)
		m.stats.Events[idem.EventReleased]++
		m.wakeLocked(l.scope)
		l.rec.State = 0
		return nil
	}
	change(&r.rec, now)
	r.rec.UpdatedAt = now
	if r.rec.State != idem.StateInProgress {
		m.wakeLocked(l.scope)
	}
	l.rec = cloneRecord(r.rec)
	return nil
}

// cloneRecord copies rec with its own header and body.
func cloneRecord(rec idem.Record) idem.Record {
	rec.Response.Header = cloneHeader(rec.Response.Header)
	rec.Response.Body = bytes.Clone(rec.Response.Body)
	return rec
}

// cloneHeader copies h; an empty header becomes nil, as a store that
// encodes records reads it back.
func cloneHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	return h.Clone()
}
