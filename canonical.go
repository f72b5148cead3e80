package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/idemkv/idem/internal/canon"
)

// Profile selects how the canonicalizer reads numbers. The zero value is
// ProfileExact.
type Profile uint8

const (
	// ProfileExact compares numbers by the exact decimal value they
	// spell: 4200, 4200.0 and 4.2e3 are one number, 9007199254740993 and
	// 9007199254740992 are two. Output uses the ECMAScript number layout,
	// so for numbers of at most 15 significant digits within the range of
	// normal doubles it is byte for byte what ProfileJCS prints. A
	// non-zero number whose scientific exponent (d.ddd × 10^E) is outside
	// [-324, 308] is refused with code number_out_of_range.
	ProfileExact Profile = iota
	// ProfileJCS is RFC 8785 to the byte: numbers pass through IEEE 754
	// doubles, as in every other JCS implementation. Choose it only when
	// the canonical bytes must match another system's.
	ProfileJCS
)

// String returns "exact" or "jcs".
func (p Profile) String() string {
	switch p {
	case ProfileExact:
		return "exact"
	case ProfileJCS:
		return "jcs"
	}
	return fmt.Sprintf("Profile(%d)", uint8(p))
}

// ParseProfile returns the profile named by s ("exact" or "jcs"), the
// inverse of Profile.String.
func ParseProfile(s string) (Profile, error) {
	switch s {
	case "exact":
		return ProfileExact, nil
	case "jcs":
		return ProfileJCS, nil
	}
	return 0, fmt.Errorf("idem: unknown canonicalization profile %q (want exact or jcs)", s)
}

// CanonicalOptions configure canonicalization. The zero value is the
// exact profile, no volatile members and the default limits.
type CanonicalOptions struct {
	// Profile selects how numbers are compared. Default: ProfileExact.
	Profile Profile
	// Volatile lists RFC 6901 JSON Pointers to members or array elements
	// that change between retries of one operation without changing its
	// meaning (client timestamps, nonces, trace IDs), so they are left out
	// of the canonical form. A "*" token matches every member or element
	// at its level: "/items/*/trace_id". The document is still checked in
	// full, volatile parts included. Default: none.
	Volatile []string
	// MaxDepth bounds the nesting of objects and arrays. Default: 128.
	MaxDepth int
	// MaxBytes bounds the body length; a longer body is refused with code
	// too_large. It applies to every body Request.Fingerprint hashes, not
	// only JSON. Default: 1 MiB.
	MaxBytes int
}

// validate reports every bad field at once.
func (o *CanonicalOptions) validate() error {
	var errs []error
	if o.Profile > ProfileJCS {
		errs = append(errs, fmt.Errorf("idem: CanonicalOptions.Profile: unknown profile %d", o.Profile))
	}
	for i, p := range o.Volatile {
		if err := canon.CheckPointer(p); err != nil {
			errs = append(errs, fmt.Errorf("idem: CanonicalOptions.Volatile[%d]: %q is not a usable JSON Pointer: %s",
				i, p, strings.TrimPrefix(err.Error(), "canon: ")))
		}
	}
	if o.MaxDepth < 0 {
		errs = append(errs, fmt.Errorf("idem: CanonicalOptions.MaxDepth is negative (%d)", o.MaxDepth))
	}
	if o.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("idem: CanonicalOptions.MaxBytes is negative (%d)", o.MaxBytes))
	}
	return errors.Join(errs...)
}

func (o *CanonicalOptions) internal() canon.Options {
	p := canon.Exact
	if o.Profile == ProfileJCS {
		p = canon.JCS
	}
	return canon.Options{Profile: p, Volatile: o.Volatile, MaxDepth: o.MaxDepth, MaxBytes: o.MaxBytes}
}

// ErrInvalidBody is matched by every *BodyError, for callers that only
// need to know that the client sent a body the canonicalizer refuses (an
// HTTP 400) and not why.
var ErrInvalidBody = errors.New("idem: invalid request body")

// BodyError reports why a body cannot be canonicalized and where.
//
// Code is stable and meant for machines (API error bodies, metrics):
// syntax, invalid_utf8, lone_surrogate, duplicate_member, depth_exceeded,
// invalid_number, number_out_of_range, trailing_data, bom, too_large.
// Detail is for people and may change.
type BodyError struct {
	Code   string
	Offset int // bytes from the start of the body
	Detail string
}

func (e *BodyError) Error() string {
	return fmt.Sprintf("idem: %s at byte %d: %s", e.Code, e.Offset, e.Detail)
}

// Is reports whether target is ErrInvalidBody.
func (e *BodyError) Is(target error) bool { return target == ErrInvalidBody }

func bodyError(err error) error {
	if err == nil {
		return nil
	}
	var e *canon.Error
	if errors.As(err, &e) {
		return &BodyError{Code: string(e.Code), Offset: e.Offset, Detail: e.Detail}
	}
	return err
}

// Canonicalize returns the canonical form of the JSON document src (RFC
// 8785 layout, numbers per o.Profile, volatile members removed): with zero
// options, the bytes Request.Fingerprint hashes for a JSON body. A
// document it refuses yields a *BodyError; bad options yield an error that
// names each bad field. The returned slice is new and the caller's.
func Canonicalize(src []byte, o CanonicalOptions) ([]byte, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	co := o.internal()
	// Canonical output is rarely longer than its input; the slack covers
	// short numbers that expand (1e20 is 21 digits).
	out, err := canon.Append(make([]byte, 0, len(src)+32), src, &co)
	if err != nil {
		return nil, bodyError(err)
	}
	return out, nil
}

// Request is what a fingerprint covers: who asked (Tenant), for what
// (Method and Path, as the application routes them; include the query
// string in Path if it carries meaning) and with which body.
type Request struct {
	Method string
	Path   string
	Tenant string
	// ContentType is the request's Content-Type header. Only its media
	// type, lower-cased and without parameters, is hashed, and it decides
	// how Body is read: application/json and any */*+json type are
	// canonicalized as JSON, application/x-www-form-urlencoded as sorted
	// decoded pairs, anything else is hashed as raw bytes.
	ContentType string
	// ContentEncoding is the request's Content-Encoding header: the
	// codings applied to Body, in order. idem does not decode them, so a
	// JSON or form body with any coding but identity is hashed as the
	// bytes that arrived, with its codings. Other types are hashed as
	// bytes anyway, without them. Empty, or only identity, changes nothing.
	ContentEncoding string
	// Body is the request body. An empty body is hashed as empty, whatever
	// the media type: it is a valid request, distinct from "{}" or "null".
	Body []byte
	// Raw hashes Body as the bytes that arrived, whatever its media type:
	// for a body the canonicalizer refuses but the service accepts. A raw
	// fingerprint is of a kind of its own, so it never equals a canonical
	// one, even for a body whose bytes are another body's canonical form.
	Raw bool
}

// fingerprintVersion starts every hashed encoding. Any change to what is
// hashed or how gets a new version, so old and new fingerprints can never
// collide by accident (they simply never match).
const fingerprintVersion = "idem-fingerprint-v1\n"

// rawFingerprintVersion starts the encoding of a Raw request instead.
// Neither tag is a prefix of the other, so no raw encoding is ever a
// canonical one.
const rawFingerprintVersion = "idem-fingerprint-raw-v1\n"

// Fingerprint returns the SHA-256 of the versioned encoding of r: the
// version tag, then method, path, tenant, media type and canonical body,
// each preceded by its length as a big-endian uint64, so that no two
// different requests can produce the same byte string.
//
// The options must be the same for every request that may share a key; in
// particular, changing Volatile or Profile changes fingerprints of requests
// that use the affected members or numbers. A body the canonicalizer
// refuses yields a *BodyError.
func (r Request) Fingerprint(o CanonicalOptions) (Fingerprint, error) {
	buf := encodingPool.Get().(*[]byte)
	defer putEncoding(buf)
	enc, err := r.appendEncoding((*buf)[:0], &o)
	if err != nil {
		return Fingerprint{}, err
	}
	*buf = enc
	return sha256.Sum256(enc), nil
}

// CanonicalBody returns the body bytes as Fingerprint hashes them, so that
// a person can compare two requests that were expected to match.
func (r Request) CanonicalBody(o CanonicalOptions) ([]byte, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	return r.appendBody(nil, &o)
}

var encodingPool = sync.Pool{New: func() any { return new([]byte) }}

func putEncoding(b *[]byte) {
	if cap(*b) <= 1<<20 {
		encodingPool.Put(b)
	}
}

func (r *Request) appendEncoding(dst []byte, o *CanonicalOptions) ([]byte, error) {
	if err := o.validate(); err != nil {
		return dst, err
	}
	if r.Raw {
		dst = append(dst, rawFingerprintVersion...)
	} else {
		dst = append(dst, fingerprintVersion...)
	}
	dst = appendField(dst, r.Method)
	dst = appendField(dst, r.Path)
	dst = appendField(dst, r.Tenant)
	// A coded body of a type that is parsed (JSON, forms) is hashed raw, so
	// its codings go in the media type's field, after a ';' that no media
	// type keeps: it can never hash like the same type uncoded. Raw types
	// were hashed as bytes, codings or not, before codings were read, and
	// still are, so that keys stored then still match their retries.
	mt := mediaType(r.ContentType)
	if c := codings(r.ContentEncoding); c != "" && parsed(mt) {
		mt += ";" + c
	}
	dst = appendField(dst, mt)
	// The body's length is known only once it is canonical: reserve it.
	at := len(dst)
	dst = binary.BigEndian.AppendUint64(dst, 0)
	dst, err := r.appendBody(dst, o)
	if err != nil {
		return dst, err
	}
	binary.BigEndian.PutUint64(dst[at:], uint64(len(dst)-at-8))
	return dst, nil
}

func appendField(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(s)))
	return append(dst, s...)
}

func (r *Request) appendBody(dst []byte, o *CanonicalOptions) ([]byte, error) {
	maxBytes := o.MaxBytes
	if maxBytes == 0 {
		maxBytes = canon.DefaultMaxBytes
	}
	if len(r.Body) > maxBytes {
		return dst, &BodyError{Code: string(canon.ErrTooLarge), Offset: maxBytes,
			Detail: fmt.Sprintf("body is %d bytes, the limit is %d", len(r.Body), maxBytes)}
	}
	if len(r.Body) == 0 {
		return dst, nil
	}
	var err error
	switch mt := mediaType(r.ContentType); {
	case r.Raw || codings(r.ContentEncoding) != "" || !parsed(mt):
		dst = append(dst, r.Body...)
	case mt == "application/x-www-form-urlencoded":
		dst, err = canon.AppendForm(dst, r.Body, maxBytes)
	default:
		co := o.internal()
		dst, err = canon.Append(dst, r.Body, &co)
	}
	return dst, bodyError(err)
}

// parsed reports whether bodies of media type mt are canonicalized rather
// than hashed as bytes: JSON (and any +json type) and forms.
func parsed(mt string) bool {
	return mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "application/x-www-form-urlencoded"
}

// codings reduces a Content-Encoding header to its codings, lower-cased,
// comma-separated and without identity: "GZip, identity" is "gzip".
func codings(contentEncoding string) string {
	if contentEncoding == "" {
		return ""
	}
	var out []string
	for c := range strings.SplitSeq(contentEncoding, ",") {
		if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
			out = append(out, c)
		}
	}
	return strings.Join(out, ",")
}

// mediaType reduces a Content-Type header to the part that names the
// format: "Application/JSON; charset=utf-8" and "application/json" are one
// request.
func mediaType(contentType string) string {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}
