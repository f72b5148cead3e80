package pebblestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/internal/record"

	"github.com/idemkv/idem"
)

func init() {
	pebblefs.Use = func(opts any, fs vfs.FS) { opts.(*Options).fs = fs }
}

// Options configure a Store. The zero value of each field selects its default;
// a nil *Options selects every default.
type Options struct {
	// TTL is how long a record is kept after it is claimed: the
	// deduplication window. It must be at least ten leases long.
	// Default: 24 hours.
	TTL time.Duration

	// EndpointTTL overrides TTL for the endpoints it names. Each value
	// follows the same rule as TTL. Default: none.
	EndpointTTL map[string]time.Duration

	// Lease is how long a claim is held before it counts as abandoned;
	// holders of long operations call Lease.Extend. Default: 30 seconds.
	Lease time.Duration

	// InlineBodyBytes is the largest response body stored inside the
	// record itself; larger bodies go to separate chunks written in the
	// same batch. At most MaxBodyBytes and 16 MiB. Default: 64 KiB.
	InlineBodyBytes int

	// MaxBodyBytes is the largest response body stored at all. A larger
	// body is dropped: the record keeps its status, headers, length and
	// digest and is marked body-omitted. From InlineBodyBytes to 1 GiB.
	// Default: 4 MiB.
	MaxBodyBytes int64

	// Reconcile is called for each in-progress record whose lease has run
	// out (see Store.Reconcile). It receives a lease on the record and should
	// find out what really happened: Complete it with the real outcome,
	// Release it if the operation provably did not commit, or MarkUnknown
	// it. Returning without resolving leaves the record for the next pass.
	// It must never invent a success. Default: none; overdue records are
	// counted and logged.
	Reconcile func(ctx context.Context, l idem.Lease) error

	// SweepInterval is how often the background loop removes expired
	// records and hands overdue claims to Reconcile. Negative disables the
	// loop; Sweep and Reconcile can still be called. Default: 1 minute.
	SweepInterval time.Duration

	// CompactBytes is how many bytes of swept records make the sweeper
	// compact the spans it cleared, so that the space really returns to
	// the disk. Default: 64 MiB.
	CompactBytes int64

	// CacheBytes is the size of Pebble's block cache: memory for reading
	// records back. Pebble's memtables, up to two of 64 MiB, and the key
	// filter, two bytes per record, come on top of it. At most 1 TiB.
	// Default: 64 MiB, unless MemoryBytes is set.
	CacheBytes int64

	// MemoryBytes bounds the memory the store holds for itself, for
	// devices with little of it: the block cache, the memtables and the
	// key filter (both copies while it is rebuilt) share it, and the
	// write-ahead logs shrink with the memtables, so the disk the store
	// keeps when empty shrinks too. The process needs more than this for
	// the Go runtime, its code and the requests in flight. Smaller budgets
	// flush and compact more often and cost throughput; see docs/devices.md for
	// what to pick. It cannot be set with CacheBytes. At least 4 MiB.
	// Default: none, which sizes for a server (CacheBytes).
	MemoryBytes int64

	// Now is the clock. Tests pass a fake one. Default: time.Now.
	Now func() time.Time

	// ClockTolerance is how far the clock may read behind the newest time
	// the store has written under (its clock mark, kept on disk) before
	// Claim and TakeOver refuse with ErrClockBehind. A claim made while
	// the clock is behind by d ends its lease, and its record expires, d
	// early once the clock is right, so the tolerance stays well under
	// Lease; it stays above the small steps that time synchronisation
	// makes and the second by which the stored mark may lag. At least a
	// second; a tolerance of years turns the check off.
	// Default: 5 seconds.
	ClockTolerance time.Duration

	// fs is the filesystem Pebble uses, the operating system's unless a
	// test or harness sets another through internal/pebblefs (in memory,
	// crashable, failing on demand).
	fs vfs.FS

	// Logger receives idem's own warnings (overdue claims, sweep
	// failures). Pebble's informational lines are never passed on.
	// Default: slog.Default().
	Logger *slog.Logger

	// Events receives one Info record per state transition of a record,
	// and per answer a claim gets: claimed, replayed, conflict, mismatch,
	// pending, completed, released, unknown, failed, taken_over,
	// reconciled, swept and clock_behind. Each carries the
	// tenant, the endpoint, a hash of the key (never the key itself), a
	// fingerprint prefix, the state, the response status when there is
	// one, and the latency: how long the claim took for claim-time events,
	// how long the lease had run for the events that end one. It is
	// separate from Logger because it speaks once per request. Default:
	// none.
	Events *slog.Logger

	// MustExist makes Open fail with ErrNoStore when dir holds no store,
	// instead of creating one: tools that inspect a store set it, so a
	// mistyped path is an error rather than a new empty store.
	// Default: false.
	MustExist bool
}

// MinMemoryBytes is the smallest Options.MemoryBytes.
const MinMemoryBytes = 4 << 20

// GoMemoryLimit returns the Go runtime's soft memory limit
// (debug.SetMemoryLimit, or GOMEMLIMIT) that suits a process whose store
// has the budget memoryBytes: the budget and 16 MiB for the rest of the
// store and the requests in flight. Without a limit the Go collector lets
// the heap grow to twice what is live, and in a build without cgo, as
// cross-compiled device builds are, the budget itself is Go heap. idem
// proxy sets it for --memory unless GOMEMLIMIT is set.
func GoMemoryLimit(memoryBytes int64) int64 { return memoryBytes + 16<<20 }

// withDefaults returns a validated copy of o with every default filled in.
// It reports every bad field at once.
func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	c.EndpointTTL = maps.Clone(c.EndpointTTL)
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	def(&c.TTL, idem.DefaultTTL)
	def(&c.Lease, idem.DefaultLease)
	def(&c.SweepInterval, idem.DefaultSweepInterval)
	def(&c.ClockTolerance, 5*time.Second)
	if c.InlineBodyBytes == 0 {
		c.InlineBodyBytes = 64 << 10
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = max(idem.DefaultMaxBodyBytes, int64(c.InlineBodyBytes))
	}
	if c.CompactBytes == 0 {
		c.CompactBytes = 64 << 20
	}
	if c.CacheBytes == 0 && c.MemoryBytes == 0 {
		c.CacheBytes = 64 << 20
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.fs == nil {
		c.fs = privateFS{vfs.Default}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}

	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{idem.ErrInvalidOptions}, args...)...))
	}
	if c.Lease <= 0 {
		bad("Lease %s must be positive", c.Lease)
	}
	if err := idem.CheckTTLs(c.TTL, c.EndpointTTL, c.Lease); err != nil {
		errs = append(errs, err)
	}
	if c.InlineBodyBytes < 0 || c.InlineBodyBytes > record.MaxInlineBodyBytes {
		bad("InlineBodyBytes %d must be between 0 and 16 MiB", c.InlineBodyBytes)
	}
	if c.MaxBodyBytes < int64(c.InlineBodyBytes) || c.MaxBodyBytes > 1<<30 {
		bad("MaxBodyBytes %d must be between InlineBodyBytes (%d) and 1 GiB", c.MaxBodyBytes, c.InlineBodyBytes)
	}
	if c.ClockTolerance < time.Second {
		bad("ClockTolerance %s must be at least a second", c.ClockTolerance)
	}
	if c.CompactBytes < 0 {
		bad("CompactBytes %d must not be negative", c.CompactBytes)
	}
	if c.CacheBytes < 0 || c.CacheBytes > 1<<40 {
		bad("CacheBytes %d must be between 0 and 1 TiB", c.CacheBytes)
	}
	switch {
	case c.MemoryBytes != 0 && c.CacheBytes != 0:
		bad("MemoryBytes and CacheBytes cannot both be set: MemoryBytes includes the cache")
	case c.MemoryBytes != 0 && (c.MemoryBytes < MinMemoryBytes || c.MemoryBytes > 1<<40):
		bad("MemoryBytes %d must be between 4 MiB and 1 TiB", c.MemoryBytes)
	}
	return c, errors.Join(errs...)
}

// maxTTL returns the longest TTL of any endpoint.
func (o *Options) maxTTL() time.Duration {
	ttl := o.TTL
	for _, t := range o.EndpointTTL {
		ttl = max(ttl, t)
	}
	return ttl
}

// ttlFor returns the TTL that applies to endpoint.
func (o *Options) ttlFor(endpoint string) time.Duration {
	if ttl, ok := o.EndpointTTL[endpoint]; ok {
		return ttl
	}
	return o.TTL
}

// reconcileEvery is how often the background loop hands overdue claims to
// Reconcile, 0 when it does not, for idem.Decide.
func (o *Options) reconcileEvery() time.Duration {
	if o.Reconcile == nil || o.SweepInterval <= 0 {
		return 0
	}
	return o.SweepInterval
}
