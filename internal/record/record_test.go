package record

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/idemkv/idem"
	"github.com/klauspost/compress/s2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleRecord() *Stored {
	return &Stored{Record: idem.Record{
		Fingerprint: idem.Fingerprint{1, 2, 3},
		State:       idem.StateCompleted,
		Response: idem.Response{
			Status: 201,
			Header: http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}},
			Body:   []byte(`{"ok":true}`),
		},
		BodyLen:    11,
		BodyDigest: BodyDigest([]byte(`{"ok":true}`)),
		CreatedAt:  time.Unix(0, 1_700_000_000_000_000_001),
		UpdatedAt:  time.Unix(0, 1_700_000_000_500_000_000),
		ExpiresAt:  time.Unix(0, 1_700_086_400_000_000_001),
		LeaseUntil: time.Unix(0, 1_700_000_030_000_000_001),
		Attempts:   2,
	}, Token: [16]byte{9, 9}, Chunks: 3}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, rec := range []*Stored{sampleRecord(), {Record: idem.Record{State: idem.StateInProgress}}} {
		v, err := rec.Encode(nil)
		require.NoError(t, err)
		got, err := Decode(v)
		require.NoError(t, err)
		want := *rec
		want.StoredLen = int64(len(v))
		want.CreatedAt, want.UpdatedAt = time.Unix(0, rec.CreatedAt.UnixNano()), time.Unix(0, rec.UpdatedAt.UnixNano())
		want.ExpiresAt, want.LeaseUntil = time.Unix(0, rec.ExpiresAt.UnixNano()), time.Unix(0, rec.LeaseUntil.UnixNano())
		if len(want.Response.Body) == 0 {
			want.Response.Body = got.Response.Body // nil and empty both mean no body
		}
		assert.Equal(t, want, *got)
	}
}

// randomBytes returns n bytes that do not compress.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestBodyCompression: a body that compresses is Stored compressed and
// comes back as it was; one that does not, and one too short to try, are
// Stored as they are.
func TestBodyCompression(t *testing.T) {
	for _, tc := range []struct {
		name       string
		body       []byte
		compressed bool
	}{
		{"json", bytes.Repeat([]byte(`{"id":"pay_1","amount":4200,"currency":"usd"},`), 40), true},
		{"random", randomBytes(4096), false},
		{"short", bytes.Repeat([]byte{'a'}, minCompressBytes-1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := sampleRecord()
			rec.Chunks = 0
			rec.Response.Body, rec.BodyLen, rec.BodyDigest = tc.body, int64(len(tc.body)), BodyDigest(tc.body)
			v, err := rec.Encode(nil)
			require.NoError(t, err)
			assert.Equal(t, tc.compressed, len(v) < len(tc.body), "Stored %d bytes for a %d-byte body", len(v), len(tc.body))
			got, err := Decode(v)
			require.NoError(t, err)
			assert.Equal(t, tc.body, got.Response.Body)
		})
	}
}

// TestDecodeRejectsBadCompressedBodies: a compressed body must expand to
// exactly BodyLen bytes, only a whole inline body is ever compressed, and
// an unknown codec is damage.
func TestDecodeRejectsBadCompressedBodies(t *testing.T) {
	body := bytes.Repeat([]byte("abcdefgh"), 64)
	c := s2.Encode(nil, body)
	whole := func() *Stored {
		rec := sampleRecord()
		rec.Chunks = 0
		rec.Response.Body, rec.BodyLen = body, int64(len(body))
		return rec
	}
	got, err := whole().expand(c)
	require.NoError(t, err)
	require.Equal(t, body, got)
	for name, mutate := range map[string]func(r *Stored){
		"shorter":  func(r *Stored) { r.BodyLen-- },
		"too long": func(r *Stored) { r.BodyLen = MaxInlineBodyBytes + 1 },
		"chunks":   func(r *Stored) { r.Chunks = 1 },
		"omitted":  func(r *Stored) { r.BodyOmitted = true },
	} {
		rec := whole()
		mutate(rec)
		_, err := rec.expand(c)
		assert.ErrorIs(t, err, idem.ErrCorrupt, name)
	}
	_, err = whole().expand(c[:len(c)-1])
	assert.ErrorIs(t, err, idem.ErrCorrupt, "truncated")

	v, err := whole().Encode(nil)
	require.NoError(t, err)
	require.Equal(t, byte(codecS2), v[len(v)-1])
	v[len(v)-1] = 2 // an unknown codec
	_, err = Decode(v)
	assert.ErrorIs(t, err, idem.ErrCorrupt)
}

// asFormat1 rewrites a formatVersion 2 value with a raw body as version 1
// wrote it: the same fields without the trailing codec.
func asFormat1(t *testing.T, v []byte) []byte {
	t.Helper()
	require.Equal(t, []byte{0x90 | payloadFields}, v[headerLen:headerLen+1])
	require.Equal(t, byte(codecRaw), v[len(v)-1])
	v1 := append([]byte(nil), v[:len(v)-1]...)
	v1[0], v1[headerLen] = 1, 0x90|(payloadFields-1)
	return v1
}

// TestDecodeReadsFormat1: values written before bodies were compressed
// still decode to the same record.
func TestDecodeReadsFormat1(t *testing.T) {
	rec := sampleRecord()
	v, err := rec.Encode(nil)
	require.NoError(t, err)
	want, err := Decode(v)
	require.NoError(t, err)
	v1 := asFormat1(t, v)
	got, err := Decode(v1)
	require.NoError(t, err)
	want.StoredLen = int64(len(v1))
	assert.Equal(t, want, got)
	_, err = Decode(v1[:len(v1)-1])
	assert.ErrorIs(t, err, idem.ErrCorrupt)
}

// TestDecodeAcceptsLaterFields checks the forward-compatibility rule: a
// payload with extra trailing fields still decodes.
func TestDecodeAcceptsLaterFields(t *testing.T) {
	v, err := sampleRecord().Encode(nil)
	require.NoError(t, err)
	v[headerLen] = 0x90 | (payloadFields + 1) // fixarray of 15, the largest
	v = append(v, 0xa1, 'z')                  // "z"
	got, err := Decode(v)
	require.NoError(t, err)
	assert.Equal(t, 201, got.Response.Status)
}

func TestDecodeRejectsDamage(t *testing.T) {
	v, err := sampleRecord().Encode(nil)
	require.NoError(t, err)
	for n := range len(v) {
		_, err := Decode(v[:n])
		assert.ErrorIs(t, err, idem.ErrCorrupt, "truncated to %d bytes", n)
	}
	for _, mutate := range []func([]byte){
		func(b []byte) { b[0] = 0 },              // format version
		func(b []byte) { b[0] = 99 },             // future version
		func(b []byte) { b[1] = 0 },              // state
		func(b []byte) { b[1] = 9 },              // state
		func(b []byte) { b[headerLen] = 0x91 },   // too few fields
		func(b []byte) { b[headerLen+1] = 0xc0 }, // fingerprint not bytes
	} {
		b := append([]byte(nil), v...)
		mutate(b)
		_, err := Decode(b)
		assert.ErrorIs(t, err, idem.ErrCorrupt)
	}
}

// FuzzDecodeRecord: decoding arbitrary bytes returns a record or idem.ErrCorrupt,
// never panics, and whatever decodes re-encodes to a value that decodes to
// the same record.
func FuzzDecodeRecord(f *testing.F) {
	v, err := sampleRecord().Encode(nil)
	require.NoError(f, err)
	f.Add(v)
	f.Add(v[:headerLen])
	f.Add([]byte{})
	compressed := sampleRecord()
	compressed.Chunks = 0
	compressed.Response.Body = bytes.Repeat([]byte(`{"amount":4200},`), 16)
	compressed.BodyLen = int64(len(compressed.Response.Body))
	v, err = compressed.Encode(nil)
	require.NoError(f, err)
	f.Add(v)
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := Decode(b)
		if err != nil {
			require.ErrorIs(t, err, idem.ErrCorrupt)
			return
		}
		again, err := rec.Encode(nil)
		require.NoError(t, err)
		rec2, err := Decode(again)
		require.NoError(t, err)
		rec.StoredLen, rec2.StoredLen = 0, 0
		assert.Equal(t, rec, rec2)
	})
}

// BenchmarkDecodeRecord decodes what a replay reads: a completed record
// with one header and a 1 KiB body.
func BenchmarkDecodeRecord(b *testing.B) {
	rec := sampleRecord()
	rec.Response.Header = http.Header{"Content-Type": {"application/json"}}
	rec.Response.Body = bytes.Repeat([]byte(`{"id":"li_1","amount":4200},`), 37)[:1024]
	rec.BodyLen, rec.Chunks = 1024, 0
	v, err := rec.Encode(nil)
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(v); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodeRefusesLengthsBeyondTheValue: a byte or text string whose
// declared length runs past the end of the value is corrupt, and is found
// so before anything that long is allocated. A damaged value must cost an
// error, never a gigabyte.
func TestDecodeRefusesLengthsBeyondTheValue(t *testing.T) {
	// Long enough for a 32-bit length, and random so that the body is
	// Stored as it is.
	long := randomBytes(70000)
	withBody, withHeader, withTrailer := sampleRecord(), sampleRecord(), sampleRecord()
	withBody.Response.Body = long
	withHeader.Response.Header = http.Header{"X-Long": {string(long)}}
	for _, tc := range []struct {
		name    string
		rec     *Stored
		code    byte // msgpack bin32 or str32
		unknown bool // the string is a field after the ones this version knows
	}{
		{"body", withBody, 0xc6, false},
		{"header value", withHeader, 0xdb, false},
		{"later field", withTrailer, 0xc6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tc.rec.Encode(nil)
			require.NoError(t, err)
			var i int
			if tc.unknown {
				v[headerLen] = 0x90 | (payloadFields + 1)
				i = len(v)
				v = append(v, 0xc6, 0, 1, 0x11, 0x70)
			} else {
				i = bytes.Index(v, []byte{tc.code, 0, 1, 0x11, 0x70})
				require.Positive(t, i, "the 70000-byte string is not where the test expects it")
			}
			// Claim 1 GiB, then end the value.
			forged := append(v[:i+1:i+1], 0x40, 0, 0, 0)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = Decode(forged)
			runtime.ReadMemStats(&after)
			assert.ErrorIs(t, err, idem.ErrCorrupt)
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "decoding allocated what the forged length claimed")
		})
	}
}
