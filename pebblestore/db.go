package pebblestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/google/uuid"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/commit"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
	"github.com/idemkv/idem/internal/rows"
	"github.com/idemkv/idem/internal/walfs"
	"github.com/idemkv/idem/pebblestore/internal/compaction"
)

// recordKey is the Pebble key of s's record.
func recordKey(s idem.Scope) []byte {
	return keys.AppendRecord(make([]byte, 0, 8+len(s.Tenant)+len(s.Endpoint)+len(s.Key)), s.Tenant, s.Endpoint, s.Key)
}

// schemaVersion is written at the first Open and checked at every later
// one, and a build refuses a store of a later version than its own. Version
// 2 retires pending-index entries with single deletions; version 3 writes
// records of formatVersion 2, whose bodies may be compressed. Open upgrades
// an older store in place (upgrade).
const schemaVersion = 3

// Store is an open idempotency store. It is safe for concurrent use; most
// callers need only Claim and the Lease it returns.
type Store struct {
	opts    Options
	dir     string
	pdb     *pebble.DB
	wal     *walfs.FS
	lock    *pebble.Lock
	commits *commit.Committer
	rows    *rows.Table
	sweeper *compaction.Sweeper
	tally   idem.Tally
	waiting waiters
	clock   clockMark

	// ops is read-locked by every operation and write-locked by Close, so
	// that Close waits for operations in flight and none starts after it.
	ops    sync.RWMutex
	closed bool // guarded by ops

	stop      chan struct{}  // closed by Close to end the background loop
	bg        sync.WaitGroup // the background loop
	closeOnce sync.Once
	closeErr  error
}

// sizing is how Open divides memory among Pebble's parts.
type sizing struct {
	memTable int64 // one memtable
	// cache is Pebble's CacheSize. Pebble counts its memtables against
	// the cache: the one being filled, and the one being flushed or kept
	// for reuse; so it holds two memtables on top of the block cache. A
	// cache without them, when no larger than the memtables, has no room
	// for a single block, and every read of a table goes to the file
	// system. The cache still shrinks for a while when an iterator open
	// across a flush (a key-filter build, a sweep) holds a third
	// memtable, or when a batch of over half a memtable is held whole.
	cache int64
	// filter bounds one key filter's bytes, 0 for no bound.
	filter int64
}

// sizing divides Options.MemoryBytes: a quarter to two memtables (of at
// most 64 MiB each, beyond which a flush only takes longer), an eighth to
// the key filter (two copies while it is rebuilt) and the rest, less an
// eighth for the store's other buffers, to the block cache. Without a
// budget, the memtables and the filter come on top of CacheBytes.
func (o *Options) sizing() sizing {
	if o.MemoryBytes == 0 {
		const memTable = 64 << 20
		return sizing{memTable: memTable, cache: o.CacheBytes + 2*memTable}
	}
	m := o.MemoryBytes
	memTable := min(m/8, 64<<20)
	return sizing{memTable: memTable, cache: m * 3 / 4, filter: m / 16}
}

// tableCompression is the cheapest compression that still shrinks chunked
// bodies. Pebble's fastest profile is MinLZ except on arm64. MinLZ has
// assembly only for amd64, and its portable encoder, used everywhere
// else, stores highly repetitive blocks (a body of repeated line items)
// uncompressed; so on other processors it is Snappy.
func tableCompression() *sstable.CompressionProfile {
	if runtime.GOARCH == "amd64" {
		return sstable.FastestCompression
	}
	return sstable.SnappyCompression
}

// Open opens the store in dir, creating it if needed. A nil opts selects the
// defaults. Open fails with ErrLocked if another Store, in this process or
// another, has dir open, and with ErrInvalidOptions listing every bad field.
func Open(dir string, opts *Options) (*Store, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.MustExist {
		if desc, err := pebble.Peek(dir, o.fs); err != nil || !desc.Exists {
			return nil, fmt.Errorf("%w: %s", ErrNoStore, dir)
		}
	}
	if err := o.fs.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("idem: create data directory: %w", err)
	}
	warnIfShared(o.fs, dir, o.Logger)
	lock, err := pebble.LockDirectory(dir, o.fs)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v (close the other handle or stop the process that holds it, or use another directory)", ErrLocked, dir, err)
	}
	size := o.sizing()
	wal := walfs.New(o.fs, size.memTable)
	yield := new(atomic.Bool)
	popts := &pebble.Options{
		Comparer:           commit.Comparer(yield),
		FS:                 wal,
		Lock:               lock,
		Logger:             walfs.Logger{L: o.Logger},
		CacheSize:          size.cache,
		MemTableSize:       uint64(size.memTable),
		FormatMajorVersion: pebble.FormatNewest,
	}
	// Most claims look up keys that do not exist yet; without filters each
	// miss reads a data block from every level.
	popts.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	// Inline bodies reach Pebble compressed already, so its tables gain
	// little from compression for what it costs every flush and
	// compaction; but chunked bodies reach it raw.
	popts.Levels[0].Compression = tableCompression
	// Record values of 512 bytes or more (completions with a body of a
	// few hundred bytes or more) go to blob files at flush, and
	// compactions then move only keys and references. Keys are random,
	// so every table overlaps the whole store, and without this each
	// record is rewritten at every level it passes, and those compactions
	// take processor time from the callers and lengthen the log's syncs.
	// Pebble rewrites values into new blob files once a table would refer
	// to more flushes' blob files than the reference depth; with random
	// keys a small depth is reached all the time, and 1000 puts it off for
	// as long as a store keeps about a thousand flushes' worth of live
	// records.
	// Locality only helps scans, and idem reads records by key.
	// A blob file is deleted once none of its values is referenced; with
	// one TTL, records of one flush expire together and their files go
	// whole. Stores mixing TTLs leave files partly garbage, which Pebble
	// rewrites, an hour-old file at a time when no other compaction is
	// due, once a fifth of all blob bytes are garbage. The price is one
	// more block per random read of an old record.
	popts.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           512,
			MaxBlobReferenceDepth: 1000,
			RewriteMinimumAge:     time.Hour,
			TargetGarbageRatio:    0.2,
		}
	}
	// Pebble reports a single deletion that met more than one set here;
	// rows relies on that never happening (see its retirePending).
	popts.EventListener = &pebble.EventListener{PossibleAPIMisuse: func(i pebble.PossibleAPIMisuseInfo) {
		o.Logger.Error("idem: storage misuse", "what", i.String())
	}}
	if o.MemoryBytes != 0 { // small memtables
		spareFlash(popts)
	}
	pdb, err := pebble.Open(dir, popts)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("idem: open %s: %w", dir, err)
	}
	wal.SetLive(true)
	db := &Store{opts: o, dir: dir, pdb: pdb, wal: wal, lock: lock, stop: make(chan struct{})}
	db.commits = commit.New(pdb, yield, int(size.memTable/4), db.clock.stamp)
	db.rows = rows.New(pdb, db.commits, db.stop, size.filter)
	err = db.checkSchema()
	if err == nil {
		err = db.clock.load(pdb)
	}
	if err != nil {
		db.commits.Close()
		wal.SetLive(false)
		pdb.Close()
		lock.Close()
		return nil, err
	}
	db.sweeper = &compaction.Sweeper{
		DB:           pdb,
		Lock:         db.rows.LockKeys,
		Commit:       db.commits.Commit,
		Expire:       db.expireLocked,
		CompactBytes: o.CompactBytes,
	}
	db.bg.Add(1)
	go func() {
		defer db.bg.Done()
		db.rows.FilterLoop(func(err error) { db.opts.Logger.Warn("idem: build key filter", "err", err) })
	}()
	if o.SweepInterval > 0 {
		db.bg.Add(1)
		go db.background()
	}
	return db, nil
}

// spareFlash sets what a store with small memtables needs so as not to
// wear out flash. Each small flush would otherwise soon be compacted into
// the base level, and as the keys are random, every such compaction
// rewrites most of that level, so each record is written many times over
// as the store grows. So every value of 64 bytes or more, which is
// every record, goes to blob files at flush and is never rewritten;
// compactions move keys and references only. And level 0 gathers 32
// flushes, not 4, before they are compacted together, so that each
// rewrite of the base level carries eight times as many new records. The
// costs: a read of a record reads one more block, and a read of a key
// absent from the memtable probes the filters of up to 32 more tables
// (writes stall only at three times that).
func spareFlash(popts *pebble.Options) {
	popts.L0CompactionThreshold = 32
	popts.L0StopWritesThreshold = 96
	vsep := popts.Experimental.ValueSeparationPolicy
	popts.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		p := vsep()
		p.MinimumSize = 64
		return p
	}
}

func (db *Store) checkSchema() error {
	v, closer, err := db.pdb.Get(keys.Schema)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return db.writeSchema()
	case err != nil:
		return fmt.Errorf("idem: read schema version: %w", err)
	}
	got, n := binary.Uvarint(v)
	closer.Close()
	switch {
	case n <= 0 || got == 0: // no build ever wrote version 0
		return fmt.Errorf("%w: unreadable schema version", idem.ErrCorrupt)
	case got < schemaVersion:
		return db.upgrade(got)
	case got > schemaVersion:
		return fmt.Errorf("idem: data directory has schema version %d; this build reads version %d", got, schemaVersion)
	}
	return nil
}

func (db *Store) writeSchema() error {
	return db.commits.Commit(func(b *pebble.Batch) error {
		return b.Set(keys.Schema, binary.AppendUvarint(nil, schemaVersion), nil)
	})
}

// upgrade brings a store of schema version from up to schemaVersion. The
// version is written last, so an interrupted upgrade runs again, and a
// build that still writes the old version refuses the store.
//
// A version 1 store must first be made safe for single deletions of
// pending-index entries (see rows). Version 1 set an entry again
// in place when a write kept the lease's end, so a key may hold two sets
// in different tables; a single deletion would cancel only the newer, and
// the older would come back. Compacting the family to the last level
// leaves one set per key. Version 3 needs nothing but its number: it only
// writes a record format that older builds cannot read, and reads theirs.
func (db *Store) upgrade(from uint64) error {
	if from < 2 {
		lo, hi := keys.FamilySpan(keys.TagPending)
		if err := db.pdb.Compact(context.Background(), lo, hi, false); err != nil {
			return fmt.Errorf("idem: upgrade schema version %d: %w", from, err)
		}
	}
	return db.writeSchema()
}

// Close stops the background loop, waits for operations in flight and
// closes the store. Leases still held become unusable (ErrClosed); their
// records stay in progress and are found by the next reconciliation. Close
// may be called more than once; later calls return the first one's result.
func (db *Store) Close() error {
	db.closeOnce.Do(func() {
		close(db.stop)
		db.bg.Wait()
		db.ops.Lock()
		db.closed = true
		db.ops.Unlock()
		db.waiting.wakeAll()
		db.commits.Close()
		db.wal.SetLive(false)
		db.closeErr = errors.Join(db.pdb.Close(), db.lock.Close())
	})
	return db.closeErr
}

// enter starts an operation; the caller must call exit when done. It fails
// once Close has begun.
func (db *Store) enter() error {
	db.ops.RLock()
	if db.closed {
		db.ops.RUnlock()
		return idem.ErrClosed
	}
	return nil
}

func (db *Store) exit() { db.ops.RUnlock() }

// begin starts an operation on the record under rk: it enters the store and
// takes rk's stripe. The caller must call db.end with the stripe.
func (db *Store) begin(rk []byte) (*rows.Stripe, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	st := db.rows.Stripe(rk)
	st.Lock()
	return st, nil
}

// end finishes what begin started.
func (db *Store) end(st *rows.Stripe) {
	st.Unlock()
	db.exit()
}

// Claim tries to take the key in s for an operation with fingerprint fp,
// as idem.Store.Claim says. The record's TTL is Options.TTL, or the
// one Options.EndpointTTL gives s.Endpoint. While the clock reads further
// behind the newest time the store has written under than
// Options.ClockTolerance, Claim fails with ErrClockBehind and stores
// nothing.
func (db *Store) Claim(ctx context.Context, s idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	start := db.opts.Now()
	if err := s.Validate(); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	rk := recordKey(s)
	mu, err := db.begin(rk)
	if err != nil {
		return nil, nil, err
	}
	defer db.end(mu)
	now := db.now()
	if err := db.checkClock(s, fp, now, start); err != nil {
		return nil, nil, err
	}
	old, live, err := db.rows.ReadLocked(rk, now)
	if err != nil {
		return nil, nil, err
	}
	if live {
		rec, err := db.answerLocked(rk, s, old, fp, now, start)
		return nil, rec, err
	}

	token, err := uuid.NewRandom()
	if err != nil {
		return nil, nil, fmt.Errorf("idem: lease token: %w", err)
	}
	rec := &record.Stored{Record: idem.Record{
		Scope:       s,
		Fingerprint: fp,
		State:       idem.StateInProgress,
		CreatedAt:   now,
		UpdatedAt:   now,
		ExpiresAt:   now.Add(db.opts.ttlFor(s.Endpoint)),
		LeaseUntil:  now.Add(db.opts.Lease),
		Attempts:    1,
	}, Token: token}
	v, err := db.rows.WriteLocked(rk, old, rec, nil)
	if err != nil {
		return nil, nil, err
	}
	db.note(idem.EventClaimed, s, &rec.Record, start)
	return &lease{db: db, rk: rk, scope: s, rec: *rec, val: v, writes: mu.Writes, start: start}, nil, nil
}

// Options returns the options the store runs with, defaults filled in.
func (db *Store) Options() Options {
	o := db.opts
	o.EndpointTTL = maps.Clone(o.EndpointTTL)
	return o
}

// answerLocked answers a claim of a live record as idem.Decide says; the
// claim began at start. The event of a mismatch shows the stored
// fingerprint: the one a client keeps colliding with is what a person
// debugging the 422 looks for.
func (db *Store) answerLocked(rk []byte, s idem.Scope, rec *record.Stored, fp idem.Fingerprint, now, start time.Time) (*idem.Record, error) {
	rec.Scope = s
	event, err := idem.Decide(&rec.Record, fp, now, db.opts.reconcileEvery())
	if err == nil {
		if err := db.rows.LoadBody(rk, rec); err != nil {
			return nil, err
		}
	}
	db.note(event, s, &rec.Record, start)
	if err != nil {
		return nil, err
	}
	return &rec.Record, nil
}

// Get returns the live record for s, as idem.Store.Get says.
func (db *Store) Get(ctx context.Context, s idem.Scope) (*idem.Record, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rk := recordKey(s)
	// The stripe keeps Get from seeing a write whose sync is still running.
	mu, err := db.begin(rk)
	if err != nil {
		return nil, err
	}
	defer db.end(mu)
	rec, live, err := db.rows.ReadLocked(rk, db.now())
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, idem.ErrNotFound
	}
	rec.Scope = s
	if rec.State == idem.StateCompleted {
		if err := db.rows.LoadBody(rk, rec); err != nil {
			return nil, err
		}
	}
	return &rec.Record, nil
}
