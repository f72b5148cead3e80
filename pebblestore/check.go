package pebblestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
	"github.com/idemkv/idem/internal/rows"
)

// ProblemKind names one kind of broken invariant. The values are stable,
// so scripts and alerts may match them.
type ProblemKind string

// The kinds of problem Check reports.
const (
	// ProblemRecordKey: a key of the record family that does not parse as
	// a record key. Nobody can claim or read it.
	ProblemRecordKey ProblemKind = "record_key_malformed"
	// ProblemRecordUndecodable: a record whose value does not decode. A
	// claim or read of its key fails with ErrCorrupt.
	ProblemRecordUndecodable ProblemKind = "record_undecodable"
	// ProblemBodyMismatch: a completed record whose stored body, inline or
	// in chunks, differs in length or digest from what the record says. A
	// replay of an inline body would hand out the wrong bytes; a replay of
	// a chunked one fails with ErrCorrupt.
	ProblemBodyMismatch ProblemKind = "body_mismatch"
	// ProblemExpiryMissing: a record with no expiry-index entry at its
	// expiry time. The sweeper never deletes it.
	ProblemExpiryMissing ProblemKind = "expiry_missing"
	// ProblemExpiryStale: an expiry-index entry at a time other than its
	// record's expiry.
	ProblemExpiryStale ProblemKind = "expiry_stale"
	// ProblemExpiryOrphaned: an expiry-index entry whose record is gone.
	ProblemExpiryOrphaned ProblemKind = "expiry_orphaned"
	// ProblemPendingMissing: a record that is not completed and has no
	// pending-index entry at its lease's end. Overdue, Reconcile and the
	// overdue metrics never see it.
	ProblemPendingMissing ProblemKind = "pending_missing"
	// ProblemPendingStale: a pending-index entry for a completed record, at
	// a time other than its record's lease end, or whose value gives
	// another state or creation time than the record.
	ProblemPendingStale ProblemKind = "pending_stale"
	// ProblemPendingOrphaned: a pending-index entry whose record is gone.
	ProblemPendingOrphaned ProblemKind = "pending_orphaned"
	// ProblemIndexMalformed: an index key too short to hold a time, or a
	// pending-index value that does not parse.
	ProblemIndexMalformed ProblemKind = "index_malformed"
	// ProblemChunksMismatch: a record whose body chunks are not exactly the
	// ones numbered from 0 up to the count it gives; a record that should
	// have none counts too.
	ProblemChunksMismatch ProblemKind = "chunks_mismatch"
	// ProblemChunksOrphaned: body chunks whose record is gone.
	ProblemChunksOrphaned ProblemKind = "chunks_orphaned"
	// ProblemUnknownKey: a key in none of the families idem writes.
	ProblemUnknownKey ProblemKind = "unknown_key"
)

// A Problem is one broken invariant that Check found.
type Problem struct {
	Kind ProblemKind `json:"kind"`
	// Tenant, Endpoint and KeyHash name the record concerned: KeyHash is
	// KeyHash of its idempotency key, never the key. All three are empty
	// when the stored key does not name a record.
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	KeyHash  string `json:"key_hash"`
	// Detail says what is wrong, for people; its wording may change.
	Detail string `json:"detail"`
}

// String returns the problem on one line: kind, record and detail.
func (p Problem) String() string {
	if p.KeyHash == "" {
		return fmt.Sprintf("%s: %s", p.Kind, p.Detail)
	}
	return fmt.Sprintf("%s tenant=%s endpoint=%s key_hash=%s: %s", p.Kind,
		strconv.Quote(p.Tenant), strconv.Quote(p.Endpoint), p.KeyHash, p.Detail)
}

// CheckResult is what Check read and what it found. The zero value is an
// empty store's.
type CheckResult struct {
	// Records, ExpiryEntries, PendingEntries and Chunks count the keys of
	// each family read, sound or not.
	Records        int
	ExpiryEntries  int
	PendingEntries int
	Chunks         int
	// Problems lists every broken invariant found, in the order of the
	// keys that show them. One fault may show as two problems: an expiry
	// entry at the wrong time is both stale and missing.
	Problems []Problem
}

// OK reports whether Check found no problem.
func (r CheckResult) OK() bool { return len(r.Problems) == 0 }

// Check reads the whole store and reports every broken invariant between
// records, their index entries and their body chunks: what a crash, a bug
// or a damaged disk may leave behind. It checks that
//
//   - every record key parses and every record value decodes;
//   - every record has its expiry-index entry and, unless completed, its
//     pending-index entry, each at the record's own time, and the pending
//     entry's value gives the record's state and creation time;
//   - no index entry points to a missing record or carries a stale time;
//   - a record with an overflow body has exactly the chunks it counts,
//     holding the length and digest it gives, a completed record's inline
//     body has them too, and a record without chunks has none;
//   - no chunk belongs to a missing record, and no key lies outside the
//     families idem writes.
//
// Check reads one snapshot of the store, without the per-key locks. Every
// change idem makes to a record writes the record, its index entries and
// its chunks in one atomic batch, so writes made while Check runs neither
// show nor make it report a problem; a write whose sync has not finished
// may show. Check is still meant for a store at rest: it reads every key
// once and looks up a few more for each record, a cost a busy store pays
// in latency. Its memory does not grow with the store. The idem check
// command opens the store for itself.
//
// Problems are findings, not errors: the error is only for failing to
// read the store, or for ctx ending, and the result then holds what was
// found before it. Close waits for Check to return.
func (db *Store) Check(ctx context.Context) (CheckResult, error) {
	var res CheckResult
	if err := db.enter(); err != nil {
		return res, err
	}
	defer db.exit()
	snap := db.pdb.NewSnapshot()
	defer snap.Close()
	c := checker{r: snap, res: &res}
	if err := c.run(ctx); err != nil {
		return res, fmt.Errorf("idem: check: %w", err)
	}
	return res, nil
}

// checker holds the state of one Check.
type checker struct {
	r   pebble.Reader // the snapshot read
	res *CheckResult

	// group is the run of body chunks under one record key being counted:
	// chunk keys sort by record key, so a record's chunks are adjacent.
	group struct {
		rk []byte
		n  int
	}
}

// checkEvery is how many keys Check reads between looks at its context.
const checkEvery = 1024

func (c *checker) run(ctx context.Context) error {
	it, err := c.r.NewIter(nil)
	if err != nil {
		return err
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return errors.Join(err, it.Close())
			}
		}
		if err := c.visit(it); err != nil {
			return errors.Join(err, it.Close())
		}
	}
	if err := errors.Join(it.Error(), c.endGroup()); err != nil {
		return errors.Join(err, it.Close())
	}
	return it.Close()
}

// visit checks the key it is at, by its family.
func (c *checker) visit(it *pebble.Iterator) error {
	k := it.Key()
	var tag byte
	if len(k) > 0 {
		tag = k[0]
	}
	if tag != keys.TagBody {
		if err := c.endGroup(); err != nil {
			return err
		}
	}
	switch tag {
	case keys.TagRecord, keys.TagExpiry, keys.TagPending:
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if tag == keys.TagRecord {
			return c.record(k, v)
		}
		return c.index(k, v)
	case keys.TagBody:
		return c.chunk(k)
	case keys.TagMeta:
		if !bytes.Equal(k, keys.Schema) && !bytes.Equal(k, keys.Clock) {
			c.unknownKey(k)
		}
	default:
		c.unknownKey(k)
	}
	return nil
}

// about returns a problem of kind concerning the record under rk, with
// the scope left empty if rk is no record key.
func about(kind ProblemKind, rk []byte) Problem {
	p := Problem{Kind: kind}
	if t, e, k, err := keys.ParseRecord(rk); err == nil {
		p.Tenant, p.Endpoint, p.KeyHash = t, e, idem.KeyHash(k)
	}
	return p
}

func (c *checker) report(p Problem, format string, a ...any) {
	p.Detail = fmt.Sprintf(format, a...)
	c.res.Problems = append(c.res.Problems, p)
}

// rawHash names a stored key that names no record by a digest of its
// bytes: the bytes may hold an idempotency key.
func rawHash(k []byte) string { return idem.KeyHash(string(k)) }

// stamp prints a stored time, in Unix nanoseconds, for a detail.
func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

func (c *checker) unknownKey(k []byte) {
	c.report(Problem{Kind: ProblemUnknownKey}, "a key of %d bytes, raw hash %s, in no family idem writes", len(k), rawHash(k))
}

// get reads k from the snapshot. found reports whether k is there; v is
// the caller's.
func (c *checker) get(k []byte) (v []byte, found bool, err error) {
	v, closer, err := rows.GetValue(c.r, k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	v = bytes.Clone(v)
	return v, true, closer.Close()
}

// record checks the record stored under rk, its index entries and its
// body.
func (c *checker) record(rk, v []byte) error {
	c.res.Records++
	p := about("", rk)
	if p.KeyHash == "" {
		c.report(Problem{Kind: ProblemRecordKey}, "a record key of %d bytes, raw hash %s, does not parse", len(rk), rawHash(rk))
		return nil
	}
	rec, err := record.Decode(v)
	if err != nil {
		p.Kind = ProblemRecordUndecodable
		c.report(p, "its value of %d bytes does not decode: %v", len(v), err)
		return nil
	}
	exp := rec.ExpiresAt.UnixNano()
	if _, found, err := c.get(keys.AppendIndex(nil, keys.TagExpiry, exp, rk)); err != nil {
		return err
	} else if !found {
		p.Kind = ProblemExpiryMissing
		c.report(p, "the record expires at %s, and the expiry index has no entry at that time", stamp(exp))
	}
	if rec.State != idem.StateCompleted {
		due := rec.LeaseUntil.UnixNano()
		if _, found, err := c.get(keys.AppendIndex(nil, keys.TagPending, due, rk)); err != nil {
			return err
		} else if !found {
			p.Kind = ProblemPendingMissing
			c.report(p, "the record is %s with its lease ending at %s, and the pending index has no entry at that time", rec.State, stamp(due))
		}
	}
	if rec.Chunks > 0 {
		return c.chunks(rk, rec, p)
	}
	body := rec.Response.Body
	if rec.State == idem.StateCompleted && !rec.BodyOmitted && (int64(len(body)) != rec.BodyLen || record.BodyDigest(body) != rec.BodyDigest) {
		p.Kind = ProblemBodyMismatch
		c.report(p, "its inline body of %d bytes differs from the %d bytes and digest the record gives", len(body), rec.BodyLen)
	}
	return nil
}

// chunks checks the body chunks of rec, a record that has some.
func (c *checker) chunks(rk []byte, rec *record.Stored, p Problem) error {
	lo, hi := keys.ChunkSpan(rk)
	it, err := c.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	var (
		n        uint32
		numbered = true // every chunk so far is the next one
		size     int64
		digest   hash.Hash = sha256.New()
	)
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(lo) || binary.BigEndian.Uint32(k[len(k)-4:]) != n {
			numbered = false
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return errors.Join(err, it.Close())
		}
		digest.Write(v)
		size += int64(len(v))
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	switch {
	case n != rec.Chunks || !numbered:
		p.Kind = ProblemChunksMismatch
		if numbered {
			c.report(p, "the record has %d body chunks and counts %d", n, rec.Chunks)
		} else {
			c.report(p, "the record counts %d body chunks and has %d, not numbered from 0 in order", rec.Chunks, n)
		}
	case size != rec.BodyLen || [32]byte(digest.Sum(nil)) != rec.BodyDigest:
		p.Kind = ProblemBodyMismatch
		c.report(p, "its %d body chunks hold %d bytes that differ from the %d bytes and digest the record gives", n, size, rec.BodyLen)
	}
	return nil
}

// chunk counts a body-chunk key into the run of its record key.
func (c *checker) chunk(k []byte) error {
	c.res.Chunks++
	if len(k) < 5 {
		if err := c.endGroup(); err != nil {
			return err
		}
		c.report(Problem{Kind: ProblemChunksOrphaned}, "a body-chunk key of %d bytes, too short to name a record", len(k))
		return nil
	}
	rk := k[1 : len(k)-4]
	if c.group.n > 0 && bytes.Equal(rk, c.group.rk) {
		c.group.n++
		return nil
	}
	if err := c.endGroup(); err != nil {
		return err
	}
	c.group.rk, c.group.n = append(c.group.rk[:0], rk...), 1
	return nil
}

// endGroup judges the run of chunks counted so far, if any: their record
// must exist and have chunks. How many and which is judged with the record
// (chunks), so that each fault is reported once.
func (c *checker) endGroup() error {
	rk, n := c.group.rk, c.group.n
	if n == 0 {
		return nil
	}
	c.group.n = 0
	p := about(ProblemChunksOrphaned, rk)
	if p.KeyHash == "" {
		c.report(p, "%d body chunks under a key of %d bytes, raw hash %s, that is no record key", n, len(rk), rawHash(rk))
		return nil
	}
	v, found, err := c.get(rk)
	if err != nil || !found {
		if err == nil {
			c.report(p, "%d body chunks belong to no record", n)
		}
		return err
	}
	rec, err := record.Decode(v)
	if err != nil {
		return nil // reported with the record
	}
	if rec.Chunks == 0 {
		p.Kind = ProblemChunksMismatch
		c.report(p, "the record has %d body chunks and counts none", n)
	}
	return nil
}

// index checks an expiry- or pending-index entry against its record.
func (c *checker) index(k, v []byte) error {
	tag := k[0]
	name, orphaned := "expiry", ProblemExpiryOrphaned
	if tag == keys.TagPending {
		c.res.PendingEntries++
		name, orphaned = "pending", ProblemPendingOrphaned
	} else {
		c.res.ExpiryEntries++
	}
	at, rk, err := keys.ParseIndex(k)
	if err != nil {
		c.report(Problem{Kind: ProblemIndexMalformed}, "a %s-index key of %d bytes, too short to hold a time", name, len(k))
		return nil
	}
	p := about(orphaned, rk)
	if p.KeyHash == "" {
		c.report(p, "a %s entry at %s under a key of %d bytes, raw hash %s, that is no record key", name, stamp(at), len(rk), rawHash(rk))
		return nil
	}
	rv, found, err := c.get(rk)
	if err != nil {
		return err
	}
	if !found {
		c.report(p, "a %s entry at %s belongs to no record", name, stamp(at))
		return nil
	}
	rec, err := record.Decode(rv)
	if err != nil {
		return nil // reported with the record
	}
	if tag == keys.TagExpiry {
		if exp := rec.ExpiresAt.UnixNano(); at != exp {
			p.Kind = ProblemExpiryStale
			c.report(p, "an expiry entry at %s, and the record expires at %s", stamp(at), stamp(exp))
		}
		return nil
	}
	p.Kind = ProblemPendingStale
	if rec.State == idem.StateCompleted {
		c.report(p, "a pending entry at %s, and the record is completed", stamp(at))
		return nil
	}
	if due := rec.LeaseUntil.UnixNano(); at != due {
		c.report(p, "a pending entry at %s, and the record's lease ends at %s", stamp(at), stamp(due))
		return nil
	}
	created, state, ok := record.ParsePending(v)
	switch {
	case !ok:
		p.Kind = ProblemIndexMalformed
		c.report(p, "the pending entry at %s has a value of %d bytes, not 9", stamp(at), len(v))
	case state != rec.State || !created.Equal(rec.CreatedAt):
		c.report(p, "the pending entry at %s says %s, created at %s, and the record is %s, created at %s",
			stamp(at), state, stamp(created.UnixNano()), rec.State, stamp(rec.CreatedAt.UnixNano()))
	}
	return nil
}
