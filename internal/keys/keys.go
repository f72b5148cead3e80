// Package keys holds the byte layout of everything idem writes to Pebble.
//
// Every family starts with one tag byte. A record key is prefix-free: each of
// its three parts carries a uvarint length, so no record key is a prefix of
// another, and a family that appends to a record key ('b', 'x', 'p') can
// never mistake one record's entries for another's. Tenants come first, so a
// tenant's records are one contiguous span.
//
//	'r' 0x01 uvarint(len t) t uvarint(len e) e uvarint(len k) k   record
//	'x' BE64(expires_at) <record key>                             expiry index, empty value
//	'p' BE64(lease_until) <record key>                            pending index, value BE64(created_at) state
//	'b' <record key> BE32(chunk)                                  body chunk
//	'm' "schema"                                                  schema version, uvarint
//	'm' "clock"                                                   clock mark: newest time a write used, BE64 Unix ns
//
// Times are Unix nanoseconds with the sign bit flipped, so they sort as
// unsigned big-endian integers.
package keys

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
)

// Family tags.
const (
	TagRecord  = 'r'
	TagExpiry  = 'x'
	TagPending = 'p'
	TagBody    = 'b'
	TagMeta    = 'm'
)

// recordVersion is the second byte of a record key. A new key layout would
// get a new value, so old and new records never interleave.
const recordVersion = 0x01

// Schema is the key under which the schema version is kept.
var Schema = []byte{TagMeta, 's', 'c', 'h', 'e', 'm', 'a'}

// Clock is the key under which the clock mark is kept: the newest clock
// reading the store has written under. The 'm' tag keeps it apart from
// every record key.
var Clock = []byte{TagMeta, 'c', 'l', 'o', 'c', 'k'}

// ErrMalformed reports bytes that are not a key of the expected family.
var ErrMalformed = errors.New("keys: malformed key")

// AppendRecord appends the record key of (tenant, endpoint, key) to dst.
func AppendRecord(dst []byte, tenant, endpoint, key string) []byte {
	dst = append(dst, TagRecord, recordVersion)
	dst = binary.AppendUvarint(dst, uint64(len(tenant)))
	dst = append(dst, tenant...)
	dst = binary.AppendUvarint(dst, uint64(len(endpoint)))
	dst = append(dst, endpoint...)
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	return append(dst, key...)
}

// ParseRecord splits a record key into its parts. The returned strings are
// copies.
func ParseRecord(rk []byte) (tenant, endpoint, key string, err error) {
	if len(rk) < 2 || rk[0] != TagRecord || rk[1] != recordVersion {
		return "", "", "", ErrMalformed
	}
	rest := rk[2:]
	var parts [3]string
	for i := range parts {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)-w) {
			return "", "", "", ErrMalformed
		}
		parts[i] = string(rest[w : w+int(n)])
		rest = rest[w+int(n):]
	}
	if len(rest) != 0 {
		return "", "", "", ErrMalformed
	}
	return parts[0], parts[1], parts[2], nil
}

// RecordSpan returns the span [lo, hi) of the record keys whose leading
// parts are parts: none spans every record, one a tenant, two a tenant's
// endpoint. Parts are length-prefixed as in a record key, so the span of
// tenant "a" never holds tenant "ab".
func RecordSpan(parts ...string) (lo, hi []byte) {
	lo = []byte{TagRecord, recordVersion}
	for _, p := range parts {
		lo = binary.AppendUvarint(lo, uint64(len(p)))
		lo = append(lo, p...)
	}
	return lo, prefixEnd(lo)
}

// prefixEnd returns the smallest key greater than every key that starts
// with p. p never consists of 0xff bytes only: it starts with a tag.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// AppendIndex appends an index key of family tag ('x' or 'p') at time t
// (Unix nanoseconds) for the record key rk.
func AppendIndex(dst []byte, tag byte, t int64, rk []byte) []byte {
	dst = slices.Grow(dst, 9+len(rk))
	dst = append(dst, tag)
	dst = binary.BigEndian.AppendUint64(dst, timeBits(t))
	return append(dst, rk...)
}

// IndexBound returns the smallest index key of family tag at time t or later:
// [IndexBound(tag, math.MinInt64), IndexBound(tag, now+1)) spans every entry
// due by now.
func IndexBound(tag byte, t int64) []byte {
	return AppendIndex(make([]byte, 0, 9), tag, t, nil)
}

// ParseIndex splits an index key into its time and record key. The record
// key aliases ik.
func ParseIndex(ik []byte) (t int64, rk []byte, err error) {
	if len(ik) < 9 || (ik[0] != TagExpiry && ik[0] != TagPending) {
		return 0, nil, ErrMalformed
	}
	return int64(binary.BigEndian.Uint64(ik[1:9]) ^ signBit), ik[9:], nil
}

// signBit flips the sign so that negative times (before 1970, seen only from
// fake clocks) still sort before positive ones.
const signBit = 1 << 63

func timeBits(t int64) uint64 { return uint64(t) ^ signBit }

// AppendChunk appends the key of body chunk i of record rk.
func AppendChunk(dst, rk []byte, i uint32) []byte {
	dst = slices.Grow(dst, 5+len(rk))
	dst = append(dst, TagBody)
	dst = append(dst, rk...)
	return binary.BigEndian.AppendUint32(dst, i)
}

// ChunkSpan returns the span [lo, hi) holding every body chunk of rk.
func ChunkSpan(rk []byte) (lo, hi []byte) {
	lo = AppendChunk(nil, rk, 0)
	hi = AppendChunk(nil, rk, math.MaxUint32)
	return lo, append(hi, 0)
}

// FamilySpan returns the span [lo, hi) of every key of family tag.
func FamilySpan(tag byte) (lo, hi []byte) { return []byte{tag}, []byte{tag + 1} }
