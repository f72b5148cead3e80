package idem

import (
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// committer coalesces the writes of concurrent callers into one Pebble batch
// and one WAL sync. A sync costs about as much for one record as for dozens,
// so under load the many callers waiting on a sync share it instead of
// queueing one sync each.
//
// Callers add their operations to the open group under mu and then wait for
// the group's sync. A caller that holds a stripe lock keeps it while it
// waits: Pebble makes a batch readable before its sync ends, and the stripe
// is what keeps other callers of that key from reading it too early.
type committer struct {
	db   *pebble.DB
	kick chan struct{} // capacity 1: "the open group has work"
	done chan struct{} // closed when run returns

	mu     sync.Mutex
	open   *group // guarded by mu
	closed bool   // guarded by mu

	commits atomic.Int64 // caller commits, for Metrics
	syncs   atomic.Int64 // group syncs, for Metrics
}

// group is one batch being filled, and then committed, for many callers.
type group struct {
	b      *pebble.Batch
	n      int           // callers in the group; guarded by committer.mu
	synced chan struct{} // closed once b is durable (or failed)
	err    error         // set before synced is closed
}

func newCommitter(db *pebble.DB) *committer {
	c := &committer{db: db, kick: make(chan struct{}, 1), done: make(chan struct{})}
	c.open = c.newGroup()
	go c.run()
	return c
}

func (c *committer) newGroup() *group {
	return &group{b: c.db.NewBatch(), synced: make(chan struct{})}
}

// commit adds the operations fill writes to the open group and returns once
// they are durable. fill runs under the committer's mutex, so it must only
// add operations to the batch it is given, with every value prepared
// beforehand. The operations of one call are applied atomically.
func (c *committer) commit(fill func(b *pebble.Batch) error) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	g := c.open
	if err := fill(g.b); err != nil {
		// A half-filled batch cannot be undone; fill only fails on
		// programming errors, which Pebble reports before writing.
		c.mu.Unlock()
		return err
	}
	g.n++
	// Kicking under mu means close, which closes kick under mu, can never
	// race with a send.
	select {
	case c.kick <- struct{}{}:
	default:
	}
	c.mu.Unlock()
	c.commits.Add(1)
	<-g.synced
	return g.err
}

// run commits groups one after another. While one group syncs, the next one
// fills: that is where the coalescing comes from.
func (c *committer) run() {
	defer close(c.done)
	for range c.kick {
		c.mu.Lock()
		g := c.open
		if g.n == 0 {
			c.mu.Unlock()
			continue
		}
		c.open = c.newGroup()
		c.mu.Unlock()
		g.err = g.b.Commit(pebble.Sync)
		c.syncs.Add(1)
		close(g.synced)
		g.b.Close()
	}
	// kick is closed only once closed is set, after which nobody touches
	// the open group: it is empty.
	c.open.b.Close()
}

// close refuses new commits, lets the ones already added finish, and stops
// the goroutine. Callers must not hold stripe locks.
func (c *committer) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return
	}
	c.closed = true
	close(c.kick)
	c.mu.Unlock()
	<-c.done
}
