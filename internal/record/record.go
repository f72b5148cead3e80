// Package record is the embedded store's value codec: how a record, its
// lease token and the bookkeeping of its body are laid out in a Pebble
// value, and the value of a pending-index entry. Decoding never panics and
// accepts every older layout.
package record

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/idemkv/idem"
	"github.com/klauspost/compress/s2"
	"github.com/vmihailenco/msgpack/v5"
)

// Stored is a record as the embedded store keeps it, with the fields that
// only the store reads.
type Stored struct {
	idem.Record
	Token     [16]byte // the lease's: a new one for each lease granted
	Chunks    uint32   // overflow body chunks stored beside the record
	StoredLen int64    // length of the stored value, for the sweeper's byte count
}

// Value layout: a fixed header the sweeper and read-side filter can use
// without decoding, then the msgpack payload. A new payload layout gets a new
// formatVersion; decode keeps accepting every older one.
//
// Version 2 adds the body's codec, because a version 1 decoder would hand
// out a compressed body as if it were the response.
const (
	formatVersion = 2
	headerLen     = 10 // version, state, BE64 expires_at (Unix ns)
	// payloadFields is the number of array elements formatVersion writes;
	// version 1 wrote one fewer, without the codec. Decoders skip elements
	// beyond the ones they know, so a later version may append fields
	// without a new formatVersion, as long as older decoders may ignore them.
	payloadFields = 14
)

// How an inline body is stored. Response bodies are mostly JSON, which S2
// shrinks by a third to two thirds for about a microsecond per kilobyte;
// every byte saved is a byte less to sync in the log, to hold in the
// memtable and to rewrite in each compaction, and at high concurrency those
// bytes bound throughput. A body is compressed only when that saves an
// eighth of it, so short and random bodies are kept as they are.
const (
	codecRaw = 0
	codecS2  = 1

	minCompressBytes = 128
)

// MaxInlineBodyBytes bounds the store's Options.InlineBodyBytes, and so the
// length a compressed inline body may claim to expand to.
const MaxInlineBodyBytes = 16 << 20

// errCorrupt reports a stored value that cannot be decoded.
var errCorrupt = idem.ErrCorrupt

// Encode appends r's value encoding to dst. Encoding into memory cannot
// fail, so the errors are joined rather than checked one by one.
func (r *Stored) Encode(dst []byte) ([]byte, error) {
	body, codec := r.Response.Body, codecRaw
	if len(body) >= minCompressBytes && r.wholeInline(len(body)) {
		// The compressed body is copied into dst below, so its buffer goes
		// back to the pool: every completion would otherwise allocate one
		// as large as its body.
		scratch := compressPool.Get().(*[]byte)
		defer putCompress(scratch)
		if n := s2.MaxEncodedLen(len(body)); cap(*scratch) < n {
			*scratch = make([]byte, n)
		}
		if c := s2.Encode((*scratch)[:cap(*scratch)], body); len(c) <= len(body)-len(body)/8 {
			body, codec = c, codecS2
		}
	}
	dst = append(dst, formatVersion, byte(r.State))
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.ExpiresAt.UnixNano()))
	buf := bytes.NewBuffer(dst)
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	err := errors.Join(
		enc.EncodeArrayLen(payloadFields),
		enc.EncodeBytes(r.Fingerprint[:]),
		enc.EncodeBytes(r.Token[:]),
		enc.EncodeInt(r.CreatedAt.UnixNano()),
		enc.EncodeInt(r.UpdatedAt.UnixNano()),
		enc.EncodeInt(r.LeaseUntil.UnixNano()),
		enc.EncodeUint(uint64(r.Attempts)),
		enc.EncodeInt(int64(r.Response.Status)),
		encodeHeader(enc, r.Response.Header),
		enc.EncodeBytes(body),
		enc.EncodeInt(r.BodyLen),
		enc.EncodeBytes(r.BodyDigest[:]),
		enc.EncodeUint(uint64(r.Chunks)),
		enc.EncodeBool(r.BodyOmitted),
		enc.EncodeUint(uint64(codec)),
	)
	return buf.Bytes(), err
}

func encodeHeader(enc *msgpack.Encoder, h http.Header) error {
	if err := enc.EncodeMapLen(len(h)); err != nil {
		return err
	}
	for k, vs := range h {
		if err := enc.EncodeString(k); err != nil {
			return err
		}
		if err := enc.EncodeArrayLen(len(vs)); err != nil {
			return err
		}
		for _, v := range vs {
			if err := enc.EncodeString(v); err != nil {
				return err
			}
		}
	}
	return nil
}

// peekHeader reads the fixed header of a stored value.
func peekHeader(v []byte) (idem.State, int64, error) {
	if len(v) < headerLen || v[0] == 0 || v[0] > formatVersion {
		return 0, 0, errCorrupt
	}
	s := idem.State(v[1])
	if s < idem.StateInProgress || s > idem.StateUnknown {
		return 0, 0, errCorrupt
	}
	return s, int64(binary.BigEndian.Uint64(v[2:headerLen])), nil
}

// Decode decodes a stored value; damage yields idem.ErrCorrupt. It
// never panics on arbitrary input and copies everything it keeps, so v may
// be reused afterwards.
func Decode(v []byte) (*Stored, error) {
	state, exp, err := peekHeader(v)
	if err != nil {
		return nil, err
	}
	r := &Stored{Record: idem.Record{State: state, ExpiresAt: time.Unix(0, exp)}}
	d := decoders.Get().(*recordDecoder)
	defer d.release()
	d.rd.Reset(v[headerLen:])
	dec := d.dec
	dec.Reset(&d.rd)

	hasCodec := v[0] >= 2
	fields := payloadFields
	if !hasCodec {
		fields--
	}
	n, err := dec.DecodeArrayLen()
	if err != nil || n < fields {
		return nil, errCorrupt
	}
	f := fieldReader{dec: dec, rd: &d.rd, src: v[headerLen:]}
	f.fixed(r.Fingerprint[:])
	f.fixed(r.Token[:])
	r.CreatedAt = time.Unix(0, f.int())
	r.UpdatedAt = time.Unix(0, f.int())
	r.LeaseUntil = time.Unix(0, f.int())
	r.Attempts = uint32(f.uint(1<<32 - 1))
	r.Response.Status = int(f.uint(999))
	r.Response.Header = f.header()
	body := f.view()
	r.BodyLen = f.int()
	f.fixed(r.BodyDigest[:])
	r.Chunks = uint32(f.uint(1<<32 - 1))
	r.BodyOmitted = f.bool()
	codec := uint64(codecRaw)
	if hasCodec {
		codec = f.uint(codecS2)
	}
	for i := fields; i < n && f.err == nil; i++ {
		f.err = dec.Skip()
	}
	if f.err != nil || r.BodyLen < 0 {
		return nil, errCorrupt
	}
	if codec == codecS2 {
		if r.Response.Body, err = r.expand(body); err != nil {
			return nil, err
		}
	} else {
		r.Response.Body = bytes.Clone(body)
	}
	r.StoredLen = int64(len(v))
	return r, nil
}

// wholeInline reports whether a body of n bytes is the whole response body
// of r, kept inline: the only kind encode compresses and expand accepts.
func (r *Stored) wholeInline(n int) bool {
	return int64(n) == r.BodyLen && n <= MaxInlineBodyBytes && r.Chunks == 0 && !r.BodyOmitted
}

// expand decompresses the inline body c. The length it claims is checked
// before anything that long is allocated.
func (r *Stored) expand(c []byte) ([]byte, error) {
	n, err := s2.DecodedLen(c)
	if err != nil || !r.wholeInline(n) {
		return nil, errCorrupt
	}
	body, err := s2.Decode(make([]byte, n), c)
	if err != nil {
		return nil, errCorrupt
	}
	return body, nil
}

// compressPool holds buffers for compressing bodies: the compressed body is
// copied into the value, so its buffer is used again.
var compressPool = sync.Pool{New: func() any { return new([]byte) }}

func putCompress(b *[]byte) {
	if cap(*b) <= 1<<20 {
		compressPool.Put(b)
	}
}

// recordDecoder keeps a msgpack decoder with the reader it reads from, so
// that decoding a record on the replay path allocates only what it returns.
type recordDecoder struct {
	dec *msgpack.Decoder
	rd  bytes.Reader
}

var decoders = sync.Pool{New: func() any { return &recordDecoder{dec: msgpack.NewDecoder(nil)} }}

// release returns d to the pool without a reference to the value it read,
// which may be a buffer its owner reuses.
func (d *recordDecoder) release() {
	d.rd.Reset(nil)
	decoders.Put(d)
}

// fieldReader decodes payload fields in order and keeps the first error, so
// that nothing past a broken field is read.
type fieldReader struct {
	dec *msgpack.Decoder
	rd  *bytes.Reader // what dec reads from, without a buffer between
	src []byte        // what rd reads
	err error
}

func (f *fieldReader) int() int64 {
	if f.err != nil {
		return 0
	}
	v, err := f.dec.DecodeInt64()
	f.err = err
	return v
}

func (f *fieldReader) uint(max uint64) uint64 {
	if f.err != nil {
		return 0
	}
	v, err := f.dec.DecodeUint64()
	if err == nil && v > max {
		err = errCorrupt
	}
	f.err = err
	return v
}

func (f *fieldReader) bool() bool {
	if f.err != nil {
		return false
	}
	v, err := f.dec.DecodeBool()
	f.err = err
	return v
}

// byteLen decodes the length of a byte string, -1 for nil. A length that
// runs past the end of the value is corrupt, and is refused before anyone
// allocates it: the decoder would allocate first and find the bytes
// missing after, and a damaged value must cost an error, not gigabytes.
func (f *fieldReader) byteLen() int {
	if f.err != nil {
		return -1
	}
	n, err := f.dec.DecodeBytesLen()
	if err == nil && n > f.rd.Len() {
		err = errCorrupt
	}
	f.err = err
	return n
}

// view decodes a byte string as a slice of src, without copying it: the
// body is copied once, or expanded, only when its codec is known.
func (f *fieldReader) view() []byte {
	n := f.byteLen()
	if f.err != nil || n < 0 {
		return nil
	}
	off := len(f.src) - f.rd.Len()
	_, f.err = f.rd.Seek(int64(n), io.SeekCurrent)
	return f.src[off : off+n : off+n]
}

func (f *fieldReader) string() string {
	if f.err != nil {
		return ""
	}
	v, err := f.dec.DecodeString()
	f.err = err
	return v
}

// fixed decodes a byte string that must be exactly len(dst) long into dst.
func (f *fieldReader) fixed(dst []byte) {
	if n := f.byteLen(); f.err == nil && n != len(dst) {
		f.err = errCorrupt
	}
	if f.err == nil {
		f.err = f.dec.ReadFull(dst)
	}
}

// length decodes an array or map length. Callers cap what they allocate up
// front, so a forged length costs a failed read, not memory. The encoder
// never writes a nil array or map, so one (length -1) is corrupt; a failed
// length reads as 0, which callers can allocate.
func (f *fieldReader) length(decodeLen func() (int, error)) int {
	if f.err != nil {
		return 0
	}
	n, err := decodeLen()
	if err == nil && n < 0 {
		err = errCorrupt
	}
	if f.err = err; err != nil {
		return 0
	}
	return n
}

func (f *fieldReader) header() http.Header {
	n := f.length(f.dec.DecodeMapLen)
	if n == 0 {
		return nil
	}
	h := make(http.Header, min(n, 64))
	for i := 0; i < n && f.err == nil; i++ {
		k := f.string()
		m := f.length(f.dec.DecodeArrayLen)
		vs := make([]string, 0, min(m, 16))
		for j := 0; j < m && f.err == nil; j++ {
			vs = append(vs, f.string())
		}
		h[k] = vs
	}
	return h
}

// BodyDigest is the digest recorded for every stored response body.
func BodyDigest(b []byte) [32]byte { return sha256.Sum256(b) }

// PendingValue is the value of rec's pending-index entry: enough to count
// and age the records that are not completed without reading them.
func PendingValue(rec *idem.Record) []byte {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 9), uint64(rec.CreatedAt.UnixNano()))
	return append(v, byte(rec.State))
}

// ParsePending reads a pending-index value; ok is false when it is damaged.
func ParsePending(v []byte) (created time.Time, s idem.State, ok bool) {
	if len(v) != 9 {
		return time.Time{}, 0, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), idem.State(v[8]), true
}
