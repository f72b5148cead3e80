package canon

import (
	"fmt"
	"strconv"
)

// Code is the stable, machine-readable reason a document was refused. The
// strings never change once released: callers put them in API error bodies
// and match on them. A Code is itself an error, so errors.Is(err, ErrBOM)
// matches any *Error carrying that code.
type Code string

// The codes an *Error can carry.
const (
	// ErrSyntax: the bytes are not JSON (or not a form body) at all.
	ErrSyntax Code = "syntax"
	// ErrInvalidUTF8: a byte sequence that is not well-formed UTF-8.
	ErrInvalidUTF8 Code = "invalid_utf8"
	// ErrLoneSurrogate: a \u escape names half of a surrogate pair
	// without its partner, or the halves come in the wrong order.
	ErrLoneSurrogate Code = "lone_surrogate"
	// ErrDuplicateMember: two members of one object have the same name
	// once escapes are decoded.
	ErrDuplicateMember Code = "duplicate_member"
	// ErrDepthExceeded: objects and arrays nest deeper than the limit.
	ErrDepthExceeded Code = "depth_exceeded"
	// ErrInvalidNumber: a number that breaks the RFC 8259 grammar,
	// including NaN, Infinity, leading zeros and a leading plus sign.
	ErrInvalidNumber Code = "invalid_number"
	// ErrNumberOutOfRange: a well-formed number the profile cannot
	// represent (see MinExponent and MaxExponent).
	ErrNumberOutOfRange Code = "number_out_of_range"
	// ErrTrailingData: something other than whitespace follows the value.
	ErrTrailingData Code = "trailing_data"
	// ErrBOM: the document starts with a UTF-8 byte order mark, which
	// RFC 8259 forbids senders to add.
	ErrBOM Code = "bom"
	// ErrTooLarge: the input is longer than the size limit.
	ErrTooLarge Code = "too_large"
)

func (c Code) Error() string { return "canon: " + string(c) }

// Error reports why a document was refused and where.
type Error struct {
	Code   Code
	Offset int    // bytes from the start of the input
	Detail string // for people; may change between releases
}

func (e *Error) Error() string {
	return "canon: " + string(e.Code) + " at byte " + strconv.Itoa(e.Offset) + ": " + e.Detail
}

// Unwrap returns the code, which is what lets errors.Is match it.
func (e *Error) Unwrap() error { return e.Code }

func fail(c Code, off int, format string, args ...any) *Error {
	return &Error{Code: c, Offset: off, Detail: fmt.Sprintf(format, args...)}
}

// quote shows a member name in an error without flooding the message when
// the name is hostile and long.
func quote(b []byte) string {
	const max = 64
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "..."
	}
	return strconv.Quote(string(b))
}
