// Package canon turns a JSON document into one byte string per meaning, so
// that two spellings of the same request hash alike and two different
// requests never do.
//
// The parser is strict where encoding/json is lenient (bad UTF-8, duplicate
// names, lone surrogates are errors, not repairs) and iterative: its memory
// grows with the nesting limit, never the Go stack. Output follows RFC 8785:
// no insignificant whitespace, members ordered by their UTF-16 code units,
// strings escaped the way ECMAScript's JSON.stringify does. Numbers follow
// one of two profiles; see Profile.
package canon

import (
	"math"
	"sync"
)

// Profile selects how numbers are read and printed.
type Profile uint8

const (
	// Exact keeps the decimal value a number spells, digit for digit, and
	// prints it in the layout of ECMAScript's Number.prototype.toString.
	// 4200, 4200.0 and 4.2e3 print alike; 9007199254740993 and
	// 9007199254740992 stay apart, as they would not through a double.
	// For numbers of at most 15 significant digits within the range of
	// normal doubles (magnitudes from about 2.2e-308 to 1.8e308) the
	// output equals JCS's byte for byte: a double holds such a decimal
	// exactly enough to print it back unchanged.
	Exact Profile = iota
	// JCS is RFC 8785 exactly: every number is rounded to the nearest
	// IEEE 754 double and printed as ECMAScript would print it. Use it
	// to agree with other RFC 8785 implementations.
	JCS
)

// The exact profile accepts a non-zero number only when its scientific
// exponent E (the value written as d.ddd × 10^E) lies in
// [MinExponent, MaxExponent]: the decades an IEEE double can reach, from
// its smallest subnormal (5e-324) to its largest finite value
// (1.7976931348623157e+308). Past that a double-based peer would see 0 or
// Infinity, so the number is refused rather than given a meaning nobody
// else shares. Zero is zero whatever its exponent.
const (
	MinExponent = -324
	MaxExponent = 308
)

// Defaults for the limits in Options.
const (
	DefaultMaxDepth = 128
	DefaultMaxBytes = 1 << 20
)

// Options tune Append. The zero value is the exact profile with the default
// limits and no volatile members.
type Options struct {
	Profile Profile
	// Volatile lists RFC 6901 JSON Pointers to members or elements that
	// are dropped from the output, after the whole document has been
	// checked. A "*" token matches every member of an object and every
	// element of an array. Check each with CheckPointer first: Append
	// reports a bad pointer as a plain error, not an *Error.
	Volatile []string
	// MaxDepth bounds how deeply objects and arrays nest; 0 means
	// DefaultMaxDepth.
	MaxDepth int
	// MaxBytes bounds the input length; 0 means DefaultMaxBytes. Inputs
	// of 2 GiB or more are always refused.
	MaxBytes int
}

// Append appends the canonical form of the JSON document src to dst and
// returns the extended slice. On error it returns dst unchanged in length
// (its spare capacity may have been written) and an *Error.
//
// Append is safe for concurrent use; it keeps no reference to src or dst.
func Append(dst, src []byte, o *Options) ([]byte, error) {
	maxBytes := o.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	maxBytes = min(maxBytes, math.MaxInt32)
	if len(src) > maxBytes {
		return dst, fail(ErrTooLarge, maxBytes, "input is %d bytes, the limit is %d", len(src), maxBytes)
	}
	s := statePool.Get().(*state)
	defer s.release()
	if err := s.vol.compile(o.Volatile); err != nil {
		return dst, err
	}
	s.src = src
	s.out = dst
	s.jcs = o.Profile == JCS
	s.maxDepth = o.MaxDepth
	if s.maxDepth <= 0 {
		s.maxDepth = DefaultMaxDepth
	}
	n := len(dst)
	if err := s.run(); err != nil {
		return dst[:n], err
	}
	return s.out, nil
}

var statePool = sync.Pool{New: func() any { return new(state) }}

// retainLimit stops one huge document from pinning its buffers in the pool
// for the life of the process.
const retainLimit = 1 << 16

func (s *state) release() {
	s.src, s.out = nil, nil
	if cap(s.members) > retainLimit || cap(s.keys) > retainLimit*16 ||
		cap(s.scratch) > retainLimit*16 || cap(s.stack) > retainLimit || cap(s.sets) > retainLimit {
		return
	}
	s.stack = s.stack[:0]
	s.members = s.members[:0]
	s.keys = s.keys[:0]
	s.scratch = s.scratch[:0]
	s.sets = s.sets[:0]
	statePool.Put(s)
}
