package idem

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Refusals of a new key by Limit's store, each wrapped in a *LimitError
// that says when to retry. Nothing was stored and nothing ran; a key that
// already has a record is never refused by them.
var (
	// ErrRateLimited: the tenant claimed new keys faster than its limit.
	ErrRateLimited = errors.New("idem: too many new idempotency keys")
	// ErrStoreFull: the store is above its size bound, or its disk is
	// almost out of room.
	ErrStoreFull = errors.New("idem: idempotency store is full")
)

// LimitError is a new key refused by Limit's store. Err is ErrRateLimited
// or ErrStoreFull.
type LimitError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *LimitError) Error() string { return fmt.Sprintf("%v (retry after %s)", e.Err, e.RetryAfter) }
func (e *LimitError) Unwrap() error { return e.Err }

// StoreFullRetry is the delay a store_full answer asks for: room comes
// back with a sweep or an operator, not within seconds.
const StoreFullRetry = 30 * time.Second

// DefaultLimitTenants bounds the buckets Limits keeps when Tenants is 0.
const DefaultLimitTenants = 10000

// Limits bound what Limit's store lets new keys take. Each zero field is
// no limit, or its default.
type Limits struct {
	// ClaimRate is how many new keys a second one tenant may claim, and
	// ClaimBurst how many at once (default: ClaimRate, rounded up).
	ClaimRate  float64
	ClaimBurst int
	// PerEndpoint gives each endpoint of a tenant a bucket of its own.
	PerEndpoint bool
	// Tenants bounds the buckets kept, so that invented tenants cannot
	// grow memory: the one used longest ago goes first and starts full
	// when its tenant comes back. Default: DefaultLimitTenants.
	Tenants int

	// MaxStoreBytes refuses new keys while the store takes more room, and
	// MinFreeBytes while the disk under it has less free. The store must
	// be a Sizer; figures are read at most once a SizeEvery (default 1s).
	MaxStoreBytes int64
	MinFreeBytes  int64
	SizeEvery     time.Duration

	// Now is the buckets' clock. Default: time.Now.
	Now func() time.Time
}

// Sizer is a store that says how much room it takes, which Limits'
// MaxStoreBytes and MinFreeBytes need.
type Sizer interface {
	Size(ctx context.Context) (StoreSize, error)
}

// StoreSize is a Sizer's answer.
type StoreSize struct {
	// Bytes is the room the records take: files on disk, or a table's
	// pages.
	Bytes int64
	// FreeBytes is the room left on the disk under the store, -1 when the
	// store cannot know (a database server's disk).
	FreeBytes int64
}

// Limit returns store with a guard on new keys: a claim that would create
// a record is refused with a *LimitError while its tenant is over
// o.ClaimRate or the store over its size bounds. Replays, in-progress and
// mismatch answers and completions go through untouched, so a retry
// always gets its answer and no claim in flight is stranded. A refused
// key costs one read, never a write. The buckets are this process's: N
// processes on one shared store allow N times the rate.
func Limit(store Store, o Limits) (Store, error) {
	switch {
	case o.ClaimRate < 0 || math.IsNaN(o.ClaimRate) || math.IsInf(o.ClaimRate, 0):
		return nil, fmt.Errorf("%w: Limits.ClaimRate %v must be a positive number or 0", ErrInvalidOptions, o.ClaimRate)
	case o.ClaimBurst < 0, o.Tenants < 0, o.MaxStoreBytes < 0, o.MinFreeBytes < 0, o.SizeEvery < 0:
		return nil, fmt.Errorf("%w: Limits fields must not be negative", ErrInvalidOptions)
	}
	if o.ClaimBurst == 0 {
		o.ClaimBurst = int(math.Ceil(o.ClaimRate))
	}
	if o.Tenants == 0 {
		o.Tenants = DefaultLimitTenants
	}
	if o.SizeEvery == 0 {
		o.SizeEvery = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &limited{Store: store, o: o, buckets: newBuckets(o.Tenants)}
	if o.MaxStoreBytes > 0 || o.MinFreeBytes > 0 {
		sz, ok := store.(Sizer)
		if !ok {
			return nil, fmt.Errorf("%w: Limits.MaxStoreBytes and MinFreeBytes need a store that reports its size", ErrInvalidOptions)
		}
		g.sizer = sz
	}
	return g, nil
}

// limited is Limit's store.
type limited struct {
	Store
	o       Limits
	buckets *buckets
	sizer   Sizer

	sizing  sync.Mutex   // held by the claim that reads the size
	sizedAt atomic.Int64 // when the size was read, UnixNano; 0: never
	full    atomic.Bool  // the last size read was over a bound
}

func (g *limited) Claim(ctx context.Context, s Scope, fp Fingerprint) (Lease, *Record, error) {
	refusal := g.refusal(ctx, s)
	if refusal != nil {
		if _, err := g.Store.Get(ctx, s); errors.Is(err, ErrNotFound) {
			return nil, nil, refusal
		}
	}
	l, rec, err := g.Store.Claim(ctx, s, fp)
	if l == nil {
		return l, rec, err
	}
	if refusal != nil {
		// The record expired or was released after the read: the claim is
		// new after all. A lease that cannot be given back is run rather
		// than stranded.
		if rerr := l.Release(context.WithoutCancel(ctx)); rerr == nil {
			return nil, nil, refusal
		}
	}
	if g.o.ClaimRate > 0 {
		g.buckets.get(g.bucket(s), g.o).AllowN(g.o.Now(), 1)
	}
	return l, rec, err
}

// bucket names the bucket a claim on s draws from.
func (g *limited) bucket(s Scope) string {
	if g.o.PerEndpoint {
		return s.Tenant + "\x00" + s.Endpoint
	}
	return s.Tenant
}

// refusal is the error a new key for s gets now, or nil when one may be
// claimed. It takes nothing: a claim that turns out to be a replay must
// not spend the tenant's budget.
func (g *limited) refusal(ctx context.Context, s Scope) error {
	if g.sizer != nil && g.overSize(ctx) {
		return &LimitError{Err: ErrStoreFull, RetryAfter: StoreFullRetry}
	}
	if g.o.ClaimRate <= 0 {
		return nil
	}
	tokens := g.buckets.get(g.bucket(s), g.o).TokensAt(g.o.Now())
	if tokens >= 1 {
		return nil
	}
	wait := time.Duration((1 - tokens) / g.o.ClaimRate * float64(time.Second))
	return &LimitError{Err: ErrRateLimited, RetryAfter: max(wait.Round(time.Second), time.Second)}
}

// overSize reports whether the store was over a size bound when last
// read, reading it again when that is older than SizeEvery. One claim
// reads while the others go by the last figure; a failed read keeps it.
func (g *limited) overSize(ctx context.Context) bool {
	now := g.o.Now().UnixNano()
	if now-g.sizedAt.Load() >= int64(g.o.SizeEvery) && g.sizing.TryLock() {
		defer g.sizing.Unlock()
		if sz, err := g.sizer.Size(ctx); err == nil {
			g.full.Store(g.o.MaxStoreBytes > 0 && sz.Bytes > g.o.MaxStoreBytes ||
				g.o.MinFreeBytes > 0 && sz.FreeBytes >= 0 && sz.FreeBytes < g.o.MinFreeBytes)
			g.sizedAt.Store(now)
		}
	}
	return g.full.Load()
}

// buckets is a bounded table of token buckets, least recently used out.
type buckets struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *bucket, most recently used first
	index map[string]*list.Element
}

type bucket struct {
	name string
	lim  *rate.Limiter
}

func newBuckets(n int) *buckets {
	return &buckets{max: n, order: list.New(), index: make(map[string]*list.Element)}
}

// get returns name's bucket, making a full one when there is none.
func (b *buckets) get(name string, o Limits) *rate.Limiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.index[name]; ok {
		b.order.MoveToFront(e)
		return e.Value.(*bucket).lim
	}
	if b.order.Len() >= b.max {
		old := b.order.Back()
		b.order.Remove(old)
		delete(b.index, old.Value.(*bucket).name)
	}
	lim := rate.NewLimiter(rate.Limit(o.ClaimRate), o.ClaimBurst) // full
	b.index[name] = b.order.PushFront(&bucket{name: name, lim: lim})
	return lim
}

// len is how many buckets are kept.
func (b *buckets) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.order.Len()
}
