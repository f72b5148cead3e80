// Package commit is the embedded store's group commit: concurrent
// callers' writes share one Pebble batch and one sync of the log.
package commit

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/idemkv/idem"
)

// Committer coalesces the writes of concurrent callers into one Pebble batch
// and one WAL sync. A sync costs about as much for one record as for dozens,
// so while one group's sync runs, the callers that arrive meanwhile fill the
// next group, and that group then commits with a single sync.
//
// There is no Committer goroutine: the first caller to join a group is its
// leader. It waits until no other group is committing, closes its group to
// newcomers (unless a caller already did, see maxGroupBytes) and commits
// it; the others wait for the result. The leader is a goroutine that is
// already running, so no commit waits for the scheduler to wake a helper.
//
// Groups may commit out of the order they opened in: the leaders of a
// group closed early and of the one after it race for the token. Nothing
// depends on that order, since no caller waits for another caller's write:
// two writes of one record are ordered by its stripe, held until each is
// durable.
//
// A caller that holds a stripe lock keeps it while it waits: Pebble makes a
// batch readable before its sync ends, and the stripe is what keeps other
// callers of that key from reading it too early.
type Committer struct {
	db       *pebble.DB
	maxBytes int // see New
	// flushing holds a token while a group commits, so that groups commit
	// one at a time and the next one has the whole sync to fill.
	flushing chan struct{}

	mu     sync.Mutex
	open   *group // guarded by mu: the group new callers join
	last   int    // guarded by mu: callers in the group committed last
	closed bool   // guarded by mu

	commits atomic.Int64 // caller commits
	syncs   atomic.Int64 // group commits, each with one WAL sync

	// yield is the flag of the store's comparer (Comparer): set, the next
	// comparison yields the processor.
	yield *atomic.Bool

	stamp func(b *pebble.Batch) error // see New
}

// group is one batch being filled, and then committed, for many callers.
type group struct {
	b      *pebble.Batch
	n      int           // callers in the group; guarded by Committer.mu
	synced chan struct{} // closed once b is durable (or failed)
	err    error         // set before synced is closed
}

// New returns a committer over db, whose comparer was made by Comparer
// with yield. A group closes to newcomers once its batch holds maxBytes.
// Completions with bodies in chunks can be megabytes each, and without a
// bound one group could gather dozens of them: Pebble turns a batch of half
// a memtable or more into a memtable of its own, rotating the live one for
// it, and a batch that reaches 4 GiB makes Pebble panic. A quarter of the
// memtable is a good bound: a group then holds at most that plus one
// caller's writes, and a sync of that much costs so much more than its
// fixed part that nothing is lost by splitting.
//
// stamp, when not nil, adds the store's own bookkeeping to each group's
// batch once the group is closed, so that it costs no sync of its own.
// Groups are stamped one at a time, in the order they commit.
func New(db *pebble.DB, yield *atomic.Bool, maxBytes int, stamp func(b *pebble.Batch) error) *Committer {
	c := &Committer{db: db, maxBytes: maxBytes, flushing: make(chan struct{}, 1), yield: yield, stamp: stamp}
	c.open = c.newGroup()
	return c
}

// Counts returns how many callers committed and how many syncs their
// groups took; commits divided by syncs is the batching factor.
func (c *Committer) Counts() (commits, syncs int64) { return c.commits.Load(), c.syncs.Load() }

func (c *Committer) newGroup() *group {
	return &group{b: c.db.NewBatch(), synced: make(chan struct{})}
}

// Commit adds the operations fill writes to the open group and returns once
// they are durable. fill runs under the Committer's mutex, so it must only
// add operations to the batch it is given, with every value prepared
// beforehand. The operations of one call are applied atomically.
func (c *Committer) Commit(fill func(b *pebble.Batch) error) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return idem.ErrClosed
	}
	g := c.open
	if err := fill(g.b); err != nil {
		// fill fails only on programming errors, which Pebble reports
		// before it writes anything to the batch.
		c.mu.Unlock()
		return err
	}
	g.n++
	lead := g.n == 1
	if g.b.Len() >= c.maxBytes {
		c.open = c.newGroup() // closed to newcomers
	}
	c.mu.Unlock()
	c.commits.Add(1)
	if !lead {
		<-g.synced
		return g.err
	}

	c.flushing <- struct{}{}
	c.gather(g)
	c.mu.Lock()
	if c.open == g {
		c.open = c.newGroup()
	}
	c.last = g.n
	c.mu.Unlock()
	if c.stamp != nil {
		g.err = c.stamp(g.b)
	}
	if g.n >= yieldGroup {
		c.yield.Store(true)
	}
	if g.err == nil {
		g.err = g.b.Commit(pebble.Sync)
	}
	c.yield.Store(false)
	c.syncs.Add(1)
	<-c.flushing
	close(g.synced)
	g.b.Close()
	return g.err
}

// gatherRounds bounds how many times a leader yields before committing.
const gatherRounds = 8

// gather lets callers that are about to join g do so before it closes,
// unless a caller already closed it (see New). When a group's sync
// ends, its callers all wake at once and need the CPU for a moment before
// they commit again; a leader that closed its group at once would leave
// them for the group after, two syncs away. So the leader yields its
// processor while that lets more callers in, a few times at most. A caller
// that commits alone, as at concurrency 1, never waits.
func (c *Committer) gather(g *group) {
	c.mu.Lock()
	n, last, full := g.n, c.last, c.open != g
	c.mu.Unlock()
	if last <= 1 || full {
		return
	}
	for range gatherRounds {
		runtime.Gosched()
		c.mu.Lock()
		grew := g.n > n
		n = g.n
		c.mu.Unlock()
		if !grew {
			return
		}
	}
}

// yieldGroup is the smallest group whose commit lets Pebble's log writer
// run before the group's memtable insert; see Comparer.
const yieldGroup = 8

// Comparer is Pebble's default comparer, except that the first comparison
// after flag is set yields the processor.
//
// Pebble commits a batch in two steps on the committing goroutine: it
// queues the log record and wakes its log writer goroutine, then inserts
// the batch into the memtable, and only then waits for the sync. The Go
// scheduler puts a goroutine woken this way on the waker's processor, to
// run when the waker blocks; with every processor busy, as at high
// concurrency on two cores, the sync starts only once the insert is done,
// which for a large group takes a good part of a sync, when the two could
// overlap.
// Pebble has no hook between its two steps, but the insert begins with a
// comparison; so for a large group the Committer sets flag, and the
// insert's first comparison yields, which lets the log writer start the
// sync. A small
// group's insert is short, and a yield would only add a context switch to
// each commit, so it does not set flag. If Pebble reorders its steps, the
// yield lands elsewhere and costs a context switch, nothing more.
func Comparer(flag *atomic.Bool) *pebble.Comparer {
	c := *pebble.DefaultComparer
	compare := c.Compare
	c.Compare = func(a, b []byte) int {
		if flag.Load() && flag.CompareAndSwap(true, false) {
			runtime.Gosched()
		}
		return compare(a, b)
	}
	return &c
}

// Close refuses new commits. The store calls it once no operation is in
// flight, so the open group is empty.
func (c *Committer) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.open.b.Close()
	}
}
