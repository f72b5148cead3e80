package rows

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
)

// Most claims are of keys never used before, and proving a key absent is
// the dearest read Pebble does: a search of the whole memtable skiplist,
// a cache miss per node once it holds a few hundred thousand entries, then
// a filter probe per table. keyFilter answers most of those claims from
// memory instead: a Bloom filter over every record key in the store. It
// may say "maybe" for a key that is absent, which costs the read it would
// have cost anyway; it must never say "absent" for a stored key, which
// would let a retry run its operation twice. So:
//
//   - every record write adds its key to the filter before it commits
//     (WriteLocked), under the key's stripe, so that no reader of the key
//     can look between the two;
//   - a new filter is built by scanning the records in the background
//     while writes add to both the old and the new one, and replaces the
//     old one only when the scan is done (BuildFilter). Until the first
//     build ends, every read goes to Pebble;
//   - deletions leave their bits: a swept key reads as "maybe" until the
//     next build.
//
// A filter is sized for twice the keys its predecessor holds; once as many
// keys were added to it as it was sized for, the next build starts. Under
// a memory bound, a store with more records than the largest filter
// allowed holds does without one: every read goes to Pebble, whose own
// table filters still spare most reads of absent keys a data block. A
// sweep that removes records tries again.
type keyFilter struct {
	// words holds the bits, a power of two of them. One word per key, so
	// a probe costs one cache miss: a key's word is chosen by the top bits
	// of its hash, and its filterProbes bits within the word by the low
	// bits.
	words []atomic.Uint64
	shift uint
	// capacity is how many keys the filter holds at about 1% false
	// positives (16 bits per key); added counts the records its build
	// scanned and the new records written since.
	capacity int64
	added    atomic.Int64
}

// filterPair is what writers add to: the filter readers use, and the one
// being built, if any. It is replaced whole, so that a writer sees both
// halves of one moment.
type filterPair struct{ cur, next *keyFilter }

const (
	filterProbes = 4
	// minFilterKeys sizes the first filter: 256 KiB.
	minFilterKeys = 1 << 17
	// filterRetry is how long a failed build waits before the next.
	filterRetry = time.Minute
)

// filterKeysWithin returns the capacity of the largest filter that fits in
// bytes, or 0, no bound, when bytes is 0, or -1, no filter at all, when
// even the first filter does not fit.
func filterKeysWithin(bytes int64) int64 {
	if bytes <= 0 {
		return 0
	}
	words := bytes / 8
	if words < minFilterKeys/4 {
		return -1
	}
	return int64(1) << (bits.Len64(uint64(words)) - 1) * 4
}

func newKeyFilter(capacity int64) *keyFilter {
	// 16 bits per key is four keys per word.
	n := uint64(max(capacity, 4)+3) / 4
	logN := bits.Len64(n - 1)
	return &keyFilter{words: make([]atomic.Uint64, 1<<logN), shift: uint(64 - logN), capacity: int64(1<<logN) * 4}
}

// word returns the word of hash h and the bits h sets in it.
func (f *keyFilter) word(h uint64) (*atomic.Uint64, uint64) {
	var mask uint64
	for i := range filterProbes {
		mask |= 1 << ((h >> (6 * i)) & 63)
	}
	return &f.words[h>>f.shift], mask
}

func (f *keyFilter) add(h uint64) {
	w, mask := f.word(h)
	w.Or(mask)
}

func (f *keyFilter) mayContain(h uint64) bool {
	w, mask := f.word(h)
	return w.Load()&mask == mask
}

// filterAdd adds the record key with hash h to the filters; the caller
// holds its stripe and has not committed the write yet.
func (t *Table) filterAdd(h uint64, fresh bool) {
	p := t.filters.Load()
	for _, f := range []*keyFilter{p.cur, p.next} {
		if f == nil {
			continue
		}
		f.add(h)
		// The filter being built counts new keys too: those written after
		// its scan's snapshot are in no other count. A key both written
		// during the build and found by its scan counts twice, which only
		// brings the next build nearer.
		if fresh && f.added.Add(1) == f.capacity && f == p.cur {
			t.signalRefilter()
		}
	}
}

// mayExist reports whether a record may be stored under the key with hash
// h; false is certain. The caller holds its stripe.
func (t *Table) mayExist(h uint64) bool {
	f := t.filters.Load().cur
	return f == nil || f.mayContain(h)
}

// FilterLoop builds the first filter and then a larger one each time the
// current one fills, until stop is closed. A failed build is passed to
// warn and tried again later; reads keep going to Pebble meanwhile.
func (t *Table) FilterLoop(warn func(error)) {
	for {
		var retry <-chan time.Time
		if err := t.BuildFilter(nil); err != nil && !errors.Is(err, idem.ErrClosed) {
			warn(err)
			retry = time.After(filterRetry)
		}
		select {
		case <-t.stop:
			return
		case <-t.refilter:
		case <-retry:
		}
	}
}

// BuildFilter replaces the current filter with one built from the stored
// records, sized by filterCapacity. It returns
// idem.ErrClosed if stop was closed meanwhile. Builds never overlap. afterSnapshot,
// if not nil, runs once the scan has its snapshot: tests write behind the
// scan's back with it. It is an argument rather than a field so that only
// the build a test starts runs it, never one of the background loop's.
func (t *Table) BuildFilter(afterSnapshot func()) error {
	t.building.Lock()
	defer t.building.Unlock()
	if t.maxFilter < 0 {
		return nil
	}
	old := t.filters.Load().cur
	capacity := filterCapacity(old, t.minFilter)
	capped := t.maxFilter > 0 && capacity >= t.maxFilter
	if capped {
		capacity = t.maxFilter
	}
	nf := newKeyFilter(capacity)
	t.filters.Store(&filterPair{cur: old, next: nf})
	// A writer that took its stripe before the line above may have added
	// its key to old only; once those writes have ended they have
	// committed, and the scan below sees them.
	t.awaitWrites()
	n, err := t.scanRecordKeys(nf, afterSnapshot)
	if err != nil {
		t.filters.Store(&filterPair{cur: old})
		return err
	}
	nf.added.Add(n)
	if capped && nf.bornFull() {
		t.filters.Store(&filterPair{})
		t.dropped.Store(true)
		return nil
	}
	t.filters.Store(&filterPair{cur: nf})
	t.dropped.Store(false)
	if nf.bornFull() {
		t.signalRefilter()
	}
	return nil
}

// Swept tells the table that a sweep removed records, which may bring a
// store that outgrew the filter's bound back under it.
func (t *Table) Swept() {
	if t.dropped.Load() {
		t.signalRefilter()
	}
}

// bornFull reports whether a filter that was just built needs replacing at
// once, by one for twice what it holds: the store outgrew the count its
// size came from (a first build on a large store), or writes went on
// during the scan, perhaps past the point where filterAdd asks for a build,
// which it does only for the filter in use. A filter sized for twice its
// predecessor is born about half full, so the mark sits well above a half:
// at a half, nearly every build would be followed at once by a second scan
// of the whole store for a filter four times the first.
func (f *keyFilter) bornFull() bool { return f.added.Load() >= f.capacity*3/4 }

// filterCapacity sizes the filter that replaces old: for twice the keys
// old holds, the ones its build found and the ones written since, and for
// at least minKeys. Sizing from the build's count alone would, when the
// writes are what filled old, make a filter no larger than old and full at
// once, and cost a second build.
func filterCapacity(old *keyFilter, minKeys int64) int64 {
	if old == nil {
		return minKeys
	}
	return max(minKeys, 2*old.added.Load())
}

func (t *Table) signalRefilter() {
	select {
	case t.refilter <- struct{}{}:
	default:
	}
}

// scanRecordKeys adds every stored record key to f and returns how many
// there were. afterSnapshot is BuildFilter's.
func (t *Table) scanRecordKeys(f *keyFilter, afterSnapshot func()) (int64, error) {
	lo, hi := keys.RecordSpan()
	it, err := t.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, fmt.Errorf("idem: scan record keys: %w", err)
	}
	if afterSnapshot != nil {
		afterSnapshot()
	}
	var n int64
	for ok := it.First(); ok; ok = it.Next() {
		if n%4096 == 0 {
			select {
			case <-t.stop:
				it.Close()
				return 0, idem.ErrClosed
			default:
			}
		}
		f.add(t.hash(it.Key()))
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, fmt.Errorf("idem: scan record keys: %w", err)
	}
	return n, nil
}
