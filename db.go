package idem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/google/uuid"

	"github.com/idemkv/idem/compaction"
	"github.com/idemkv/idem/internal/keys"
)

// recordKey is the Pebble key of s's record.
func recordKey(s Scope) []byte {
	return keys.AppendRecord(make([]byte, 0, 8+len(s.Tenant)+len(s.Endpoint)+len(s.Key)), s.Tenant, s.Endpoint, s.Key)
}

// schemaVersion is written at the first Open and checked at every later
// one, and a build refuses a store of a later version than its own. Version
// 2 retires pending-index entries with single deletions; version 3 writes
// records of formatVersion 2, whose bodies may be compressed. Open upgrades
// an older store in place (upgrade).
const schemaVersion = 3

// numStripes is the number of per-key mutexes. Enough that unrelated keys
// rarely share one at a few hundred concurrent requests.
const numStripes = 4096

// chunkBytes is the size of one overflow body chunk.
const chunkBytes = 64 << 10

// DB is an open idempotency store. It is safe for concurrent use; most
// callers need only Claim and the Lease it returns.
type DB struct {
	opts    Options
	pdb     *pebble.DB
	wal     *walFS
	lock    *pebble.Lock
	commits *committer
	sweeper *compaction.Sweeper
	seed    maphash.Seed
	stripes [numStripes]stripe
	stats   counters
	waiting waiters

	filters  atomic.Pointer[filterPair]
	building sync.Mutex    // held by buildFilter
	refilter chan struct{} // asks filterLoop for a new build
	// minFilter is the smallest filter built; tests change it, holding
	// building.
	minFilter int64

	// ops is read-locked by every operation and write-locked by Close, so
	// that Close waits for operations in flight and none starts after it.
	ops    sync.RWMutex
	closed bool // guarded by ops

	stop      chan struct{}  // closed by Close to end the background loop
	bg        sync.WaitGroup // the background loop
	closeOnce sync.Once
	closeErr  error
}

// memTableBytes is the size of Pebble's memtable. Pebble counts its
// memtables against the block cache: the one being filled, and the one
// being flushed or kept for reuse. So the cache gets memTableShare on top
// of Options.CacheBytes: a cache of CacheBytes alone, when that is no
// larger than the memtables, has no room for a single block, and every
// read of a table goes to the file system and decompresses its block.
// The cache still shrinks for a while when an iterator open across a
// flush (a key-filter build, a sweep) holds a third memtable, or when a
// batch of over 32 MiB (bodies that large) is held whole.
const (
	memTableBytes = 64 << 20
	memTableShare = 2 * memTableBytes
)

// Open opens the store in dir, creating it if needed. A nil opts selects the
// defaults. Open fails with ErrLocked if another DB, in this process or
// another, has dir open, and with ErrInvalidOptions listing every bad field.
func Open(dir string, opts *Options) (*DB, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.MustExist {
		if desc, err := pebble.Peek(dir, o.FS); err != nil || !desc.Exists {
			return nil, fmt.Errorf("%w: %s", ErrNoStore, dir)
		}
	}
	if err := o.FS.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("idem: create data directory: %w", err)
	}
	lock, err := pebble.LockDirectory(dir, o.FS)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v (close the other handle or stop the process that holds it, or use another directory)", ErrLocked, dir, err)
	}
	wal := newWALFS(o.FS)
	yield := new(atomic.Bool)
	popts := &pebble.Options{
		Comparer:           yieldingComparer(yield),
		FS:                 wal,
		Lock:               lock,
		Logger:             pebbleLogger{o.Logger},
		CacheSize:          o.CacheBytes + memTableShare,
		MemTableSize:       memTableBytes,
		FormatMajorVersion: pebble.FormatNewest,
	}
	// Most claims look up keys that do not exist yet; without filters each
	// miss reads a data block from every level.
	popts.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	// Inline bodies reach Pebble compressed already (encode), so its
	// tables gain little from compression for what it costs every flush
	// and compaction; but chunked bodies reach it raw. The fastest profile
	// (MinLZ; Snappy on arm64) keeps tables about as small as Snappy did at
	// less processor time: see bench/README.md.
	popts.Levels[0].Compression = func() *sstable.CompressionProfile { return sstable.FastestCompression }
	// Record values of 512 bytes or more (completions with a body of a
	// few hundred bytes or more) go to blob files at flush, and
	// compactions then move only keys and references. Keys are random,
	// so every table overlaps the whole store, and without this each
	// record is rewritten at every level it passes: the compactions of a
	// growing store took half the processor time and lengthened the log's
	// syncs. Pebble rewrites values into new blob files once a table
	// would refer to more flushes' blob files than the reference depth;
	// at 10 that happened all the time, and 1000 puts it off for as long
	// as a store keeps about a thousand flushes' worth of live records.
	// Locality only helps scans, and idem reads records by key.
	// A blob file is deleted once none of its values is referenced; with
	// one TTL, records of one flush expire together and their files go
	// whole. Stores mixing TTLs leave files partly garbage, which Pebble
	// rewrites, an hour-old file at a time when no other compaction is
	// due, once a fifth of all blob bytes are garbage.
	// Measured on a store growing to 1.2M records: +19-21% records in the
	// same time, and random reads of the grown store about a fifth slower
	// (see bench/README.md).
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
	// retirePending relies on that never happening.
	popts.EventListener = &pebble.EventListener{PossibleAPIMisuse: func(i pebble.PossibleAPIMisuseInfo) {
		o.Logger.Error("idem: storage misuse", "what", i.String())
	}}
	pdb, err := pebble.Open(dir, popts)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("idem: open %s: %w", dir, err)
	}
	wal.live.Store(true)
	db := &DB{opts: o, pdb: pdb, wal: wal, lock: lock, seed: maphash.MakeSeed(), stop: make(chan struct{}), refilter: make(chan struct{}, 1), minFilter: minFilterKeys}
	db.filters.Store(&filterPair{})
	db.commits = newCommitter(pdb, yield)
	if err := db.checkSchema(); err != nil {
		db.commits.close()
		wal.live.Store(false)
		pdb.Close()
		lock.Close()
		return nil, err
	}
	db.sweeper = &compaction.Sweeper{
		DB:           pdb,
		Lock:         db.lockKeys,
		Commit:       db.commits.commit,
		Expire:       db.expireLocked,
		CompactBytes: o.CompactBytes,
	}
	db.bg.Add(1)
	go db.filterLoop()
	if o.SweepInterval > 0 {
		db.bg.Add(1)
		go db.background()
	}
	return db, nil
}

func (db *DB) checkSchema() error {
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
		return fmt.Errorf("%w: unreadable schema version", ErrCorrupt)
	case got < schemaVersion:
		return db.upgrade(got)
	case got > schemaVersion:
		return fmt.Errorf("idem: data directory has schema version %d; this build reads version %d", got, schemaVersion)
	}
	return nil
}

func (db *DB) writeSchema() error {
	return db.commits.commit(func(b *pebble.Batch) error {
		return b.Set(keys.Schema, binary.AppendUvarint(nil, schemaVersion), nil)
	})
}

// upgrade brings a store of schema version from up to schemaVersion. The
// version is written last, so an interrupted upgrade runs again, and a
// build that still writes the old version refuses the store.
//
// A version 1 store must first be made safe for single deletions of
// pending-index entries (see retirePending). Version 1 set an entry again
// in place when a write kept the lease's end, so a key may hold two sets
// in different tables; a single deletion would cancel only the newer, and
// the older would come back. Compacting the family to the last level
// leaves one set per key. Version 3 needs nothing but its number: it only
// writes a record format that older builds cannot read, and reads theirs.
func (db *DB) upgrade(from uint64) error {
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
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		close(db.stop)
		db.bg.Wait()
		db.ops.Lock()
		db.closed = true
		db.ops.Unlock()
		db.waiting.wakeAll()
		db.commits.close()
		db.wal.live.Store(false)
		db.closeErr = errors.Join(db.pdb.Close(), db.lock.Close())
	})
	return db.closeErr
}

// enter starts an operation; the caller must call exit when done. It fails
// once Close has begun.
func (db *DB) enter() error {
	db.ops.RLock()
	if db.closed {
		db.ops.RUnlock()
		return ErrClosed
	}
	return nil
}

func (db *DB) exit() { db.ops.RUnlock() }

// stripe guards the records whose keys hash to it: every read that must
// see only durable state and every write of such a record holds it.
type stripe struct {
	sync.Mutex
	// writes counts the writes made under this stripe. A lease that finds
	// it unchanged since its own write knows its record is untouched
	// without reading it back.
	writes uint64
}

// await returns once whoever held s when it was called has let it go. It
// is a barrier, not a critical section: nothing is read or written while
// s is held.
func (s *stripe) await() {
	s.Lock()
	defer s.Unlock()
}

// awaitWrites returns once every write that held a stripe when it was
// called has ended, durable or failed. It takes each stripe in turn and
// lets it go at once, so it holds up no write for longer than that.
func (db *DB) awaitWrites() {
	for i := range db.stripes {
		db.stripes[i].await()
	}
}

// hash is the hash of a record key that picks its stripe and its filter
// bits.
func (db *DB) hash(rk []byte) uint64 { return maphash.Bytes(db.seed, rk) }

func (db *DB) stripe(rk []byte) *stripe {
	return &db.stripes[db.hash(rk)%numStripes]
}

// begin starts an operation on the record under rk: it enters the DB and
// takes rk's stripe. The caller must call db.end with the stripe.
func (db *DB) begin(rk []byte) (*stripe, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	st := db.stripe(rk)
	st.Lock()
	return st, nil
}

// end finishes what begin started.
func (db *DB) end(st *stripe) {
	st.Unlock()
	db.exit()
}

// lockKeys locks the stripes of every record key in rks, each once and in
// ascending order, so two multi-key lockers cannot deadlock.
func (db *DB) lockKeys(rks [][]byte) (unlock func()) {
	idx := make([]uint64, 0, len(rks))
	for _, rk := range rks {
		idx = append(idx, db.hash(rk)%numStripes)
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		db.stripes[i].Lock()
	}
	return func() {
		for _, i := range idx {
			db.stripes[i].Unlock()
		}
	}
}

// get reads the value stored under k, as Pebble's Get does (getValue).
func (db *DB) get(k []byte) ([]byte, io.Closer, error) { return getValue(db.pdb, k) }

// getValue reads the value stored under k in r, as Pebble's Get does. A
// value kept in a blob file is read lazily, and when that read fails
// Pebble's Get returns no value and no error, the error coming only from
// the closer; decoded, the missing value would pass for a corrupt record.
// So when the value is empty, as a record's never is, getValue closes the
// closer and returns its error.
func getValue(r pebble.Reader, k []byte) ([]byte, io.Closer, error) {
	v, closer, err := r.Get(k)
	if err != nil || len(v) > 0 {
		return v, closer, err
	}
	if err := closer.Close(); err != nil {
		return nil, nil, err
	}
	return v, io.NopCloser(nil), nil
}

// readLocked returns the record stored under rk, or nil if there is none.
// An expired record is returned too (live reports which): callers treat it
// as absent but may need to clean up after it. The caller holds rk's stripe.
func (db *DB) readLocked(rk []byte, now time.Time) (rec *stored, live bool, err error) {
	if !db.mayExist(db.hash(rk)) {
		return nil, false, nil
	}
	v, closer, err := db.get(rk)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idem: read record: %w", err)
	}
	defer closer.Close()
	rec, err = decodeRecord(v)
	if err != nil {
		return nil, false, err
	}
	return rec, now.Before(rec.ExpiresAt), nil
}

// Claim tries to take the key in s for an operation with fingerprint fp,
// as contract.Store.Claim says. The record's TTL is Options.TTL, or the
// one Options.EndpointTTL gives s.Endpoint.
func (db *DB) Claim(ctx context.Context, s Scope, fp Fingerprint) (Lease, *Record, error) {
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
	old, live, err := db.readLocked(rk, now)
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
	rec := &stored{Record: Record{
		Scope:       s,
		Fingerprint: fp,
		State:       StateInProgress,
		CreatedAt:   now,
		UpdatedAt:   now,
		ExpiresAt:   now.Add(db.opts.ttlFor(s.Endpoint)),
		LeaseUntil:  now.Add(db.opts.Lease),
		Attempts:    1,
	}, token: token}
	v, err := db.writeLocked(rk, old, rec, nil)
	if err != nil {
		return nil, nil, err
	}
	db.stats.claims.Add(1)
	db.event(EventClaimed, s, &rec.Record, start)
	return &lease{db: db, rk: rk, scope: s, rec: *rec, val: v, writes: mu.writes, start: start}, nil, nil
}

// Options returns the options the DB runs with, defaults filled in.
func (db *DB) Options() Options {
	o := db.opts
	o.EndpointTTL = maps.Clone(o.EndpointTTL)
	return o
}

// answerLocked decides what a claim of a live record gets; the claim
// began at start.
func (db *DB) answerLocked(rk []byte, s Scope, rec *stored, fp Fingerprint, now, start time.Time) (*Record, error) {
	rec.Scope = s
	refuse := func(event string, err error, retry time.Duration) error {
		db.event(event, s, &rec.Record, start)
		return &KeyError{Err: err, State: rec.State, RetryAfter: retry, Tenant: s.Tenant, Endpoint: s.Endpoint}
	}
	if rec.Fingerprint != fp {
		db.stats.mismatches.Add(1)
		// The event shows the stored fingerprint: the one a client keeps
		// colliding with is what a person debugging the 422 looks for.
		return nil, refuse(EventMismatch, ErrFingerprintMismatch, 0)
	}
	switch {
	case rec.State == StateCompleted:
		if err := db.loadBody(rk, rec); err != nil {
			return nil, err
		}
		db.stats.replays.Add(1)
		db.event(EventReplayed, s, &rec.Record, start)
		return &rec.Record, nil
	case rec.State == StateInProgress && now.Before(rec.LeaseUntil):
		db.stats.conflicts.Add(1)
		return nil, refuse(EventConflict, ErrInProgress, min(time.Second, rec.LeaseUntil.Sub(now)))
	default:
		db.stats.pending.Add(1)
		return nil, refuse(EventPending, ErrOutcomePending, 0)
	}
}

// writeLocked durably replaces old (nil if absent) with rec under rk, with
// the index entries and body chunks that go with each. body, when set, is
// an overflow body to store in chunks rather than in the record. The caller
// holds rk's stripe and must not have changed old since reading it. It
// returns the value it stored.
//
// Only the index entries that change are written: every memtable entry
// costs a skiplist insert on the hot path.
func (db *DB) writeLocked(rk []byte, old, rec *stored, body []byte) ([]byte, error) {
	rec.chunks = uint32((len(body) + chunkBytes - 1) / chunkBytes)
	v, err := rec.encode(make([]byte, 0, 256+len(rec.Response.Body)))
	if err != nil {
		return nil, err
	}
	rec.storedLen = int64(len(v))
	h := db.hash(rk)
	db.stripes[h%numStripes].writes++
	db.filterAdd(h, old == nil)
	xk, pk := indexKeys(rk, &rec.Record)
	var oldX, oldP []byte
	if old != nil {
		oldX, oldP = indexKeys(rk, &old.Record)
	}
	var pv []byte
	if pk != nil {
		pv = pendingValue(&rec.Record)
	}
	return v, db.commits.commit(func(b *pebble.Batch) error {
		w := batchOps{b: b}
		if old != nil && old.chunks > 0 {
			w.deleteRange(keys.ChunkSpan(rk))
		}
		for i := uint32(0); i < rec.chunks; i++ {
			end := min(len(body), int(i+1)*chunkBytes)
			w.set(keys.AppendChunk(nil, rk, i), body[int(i)*chunkBytes:end])
		}
		if oldX != nil && !bytes.Equal(oldX, xk) {
			w.delete(oldX)
		}
		if oldX == nil || !bytes.Equal(oldX, xk) {
			w.set(xk, nil)
		}
		if oldP != nil {
			// Retired even when pk is the same key, so that a pending
			// entry is never set twice without a deletion between: see
			// retirePending.
			w.retirePending(oldP)
		}
		if pk != nil {
			w.set(pk, pv)
		}
		w.set(rk, v)
		return w.err
	})
}

// batchOps adds operations to a batch and keeps the first error, so that a
// sequence of writes reads as one.
type batchOps struct {
	b   *pebble.Batch
	err error
}

func (w *batchOps) set(k, v []byte) {
	if w.err == nil {
		w.err = w.b.Set(k, v, nil)
	}
}

func (w *batchOps) delete(k []byte) {
	if w.err == nil {
		w.err = w.b.Delete(k, nil)
	}
}

// retirePending deletes a pending-index entry with a single deletion: it
// and the one set it cancels vanish together at the next flush or
// compaction, instead of leaving a tombstone that compactions carry down
// the levels. Every claim sets an entry and nearly every one is retired
// within moments, so those tombstones were a steady share of compaction
// work. A single deletion is only defined when the key was set once since
// it was last deleted; writeLocked and deleteAll keep that so by retiring
// the stored entry before any new one is set.
func (w *batchOps) retirePending(pk []byte) {
	if w.err == nil {
		w.err = w.b.SingleDelete(pk, nil)
	}
}

func (w *batchOps) deleteRange(lo, hi []byte) {
	if w.err == nil {
		w.err = w.b.DeleteRange(lo, hi, nil)
	}
}

// indexKeys returns rec's expiry-index key and, unless it is completed, its
// pending-index key.
func indexKeys(rk []byte, rec *Record) (xk, pk []byte) {
	xk = keys.AppendIndex(nil, keys.TagExpiry, rec.ExpiresAt.UnixNano(), rk)
	if rec.State != StateCompleted {
		pk = keys.AppendIndex(nil, keys.TagPending, rec.LeaseUntil.UnixNano(), rk)
	}
	return xk, pk
}

// deleteLocked durably removes rec and everything that belongs to it.
func (db *DB) deleteLocked(rk []byte, rec *stored) error {
	db.stripe(rk).writes++
	return db.commits.commit(func(b *pebble.Batch) error { return deleteAll(b, rk, rec) })
}

// deleteAll adds to b the removal of rec, its index entries and its body
// chunks.
func deleteAll(b *pebble.Batch, rk []byte, rec *stored) error {
	w := batchOps{b: b}
	xk, pk := indexKeys(rk, &rec.Record)
	w.delete(xk)
	if pk != nil {
		w.retirePending(pk)
	}
	if rec.chunks > 0 {
		w.deleteRange(keys.ChunkSpan(rk))
	}
	w.delete(rk)
	return w.err
}

// pendingValue is the 'p' index value: enough to count and age pending
// records without reading them.
func pendingValue(rec *Record) []byte {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 9), uint64(rec.CreatedAt.UnixNano()))
	return append(v, byte(rec.State))
}

func parsePendingValue(v []byte) (created time.Time, s State, ok bool) {
	if len(v) != 9 {
		return time.Time{}, 0, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), State(v[8]), true
}

// loadBody reads a completed record's overflow chunks into its response and
// checks them against the stored digest.
func (db *DB) loadBody(rk []byte, rec *stored) error {
	if rec.chunks == 0 {
		return nil
	}
	lo, hi := keys.ChunkSpan(rk)
	it, err := db.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("idem: read body: %w", err)
	}
	body := make([]byte, 0, rec.BodyLen)
	var n uint32
	for ok := it.First(); ok; ok = it.Next() {
		body = append(body, it.Value()...)
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("idem: read body: %w", err)
	}
	if n != rec.chunks || int64(len(body)) != rec.BodyLen || bodyDigest(body) != rec.BodyDigest {
		return fmt.Errorf("%w: body chunks do not match the record", ErrCorrupt)
	}
	rec.Response.Body = body
	return nil
}

// Get returns the live record for s, as contract.Store.Get says.
func (db *DB) Get(ctx context.Context, s Scope) (*Record, error) {
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
	rec, live, err := db.readLocked(rk, db.now())
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, ErrNotFound
	}
	rec.Scope = s
	if rec.State == StateCompleted {
		if err := db.loadBody(rk, rec); err != nil {
			return nil, err
		}
	}
	return &rec.Record, nil
}

// pebbleLogger keeps Pebble's chatter away from users: informational lines
// are dropped, errors go to idem's logger, and a fatal error, which Pebble
// raises when the write-ahead log cannot be written or synced, ends the
// process. Continuing would risk acknowledging a write that is not on disk.
type pebbleLogger struct{ l *slog.Logger }

func (pebbleLogger) Infof(string, ...any) {}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("idem: storage error", "err", fmt.Sprintf(format, args...))
}

func (pebbleLogger) Fatalf(format string, args ...any) {
	exitOnStorageFault(fmt.Sprintf(format, args...))
}

func exitOnStorageFault(msg string) {
	fmt.Fprintf(os.Stderr, "idem: fatal storage error, exiting so that no unsynced write is acknowledged: %s\n", msg)
	os.Exit(fatalExitCode)
}

// fatalExitCode is the process exit status after a fatal storage error
// (EX_IOERR in sysexits.h).
const fatalExitCode = 74
