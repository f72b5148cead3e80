package idem_test

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

func TestCanonicalize(t *testing.T) {
	out, err := idem.Canonicalize([]byte(`{ "b": 4.2e3, "a": [9007199254740993, -0] }`), idem.CanonicalOptions{})
	require.NoError(t, err)
	assert.Equal(t, `{"a":[9007199254740993,0],"b":4200}`, string(out))

	out, err = idem.Canonicalize([]byte(`{"b":4.2e3,"a":[9007199254740993,-0],"ts":1}`),
		idem.CanonicalOptions{Profile: idem.ProfileJCS, Volatile: []string{"/ts"}})
	require.NoError(t, err)
	assert.Equal(t, `{"a":[9007199254740992,0],"b":4200}`, string(out))
}

func TestCanonicalizeErrors(t *testing.T) {
	cases := []struct {
		in   string
		o    idem.CanonicalOptions
		code string
		off  int
	}{
		{`{"a":1,"\u0061":2}`, idem.CanonicalOptions{}, "duplicate_member", 7},
		{"\"\xc0\xaf\"", idem.CanonicalOptions{}, "invalid_utf8", 1},
		{`"\udc00"`, idem.CanonicalOptions{}, "lone_surrogate", 1},
		{`[[1]]`, idem.CanonicalOptions{MaxDepth: 1}, "depth_exceeded", 1},
		{`1e309`, idem.CanonicalOptions{}, "number_out_of_range", 0},
		{`NaN`, idem.CanonicalOptions{}, "invalid_number", 0},
		{`{} x`, idem.CanonicalOptions{}, "trailing_data", 3},
		{"\xef\xbb\xbf1", idem.CanonicalOptions{}, "bom", 0},
		{`[1,2,3]`, idem.CanonicalOptions{MaxBytes: 4}, "too_large", 4},
		{`{"a":}`, idem.CanonicalOptions{}, "syntax", 5},
	}
	for _, c := range cases {
		t.Run(c.code, func(t *testing.T) {
			out, err := idem.Canonicalize([]byte(c.in), c.o)
			require.ErrorIs(t, err, idem.ErrInvalidBody)
			assert.Nil(t, out)
			var be *idem.BodyError
			require.ErrorAs(t, err, &be)
			assert.Equal(t, c.code, be.Code)
			assert.Equal(t, c.off, be.Offset)
			assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("idem: %s at byte %d: ", c.code, c.off)), err.Error())
		})
	}
}

func TestCanonicalOptionsValidation(t *testing.T) {
	_, err := idem.Canonicalize([]byte(`{}`), idem.CanonicalOptions{
		Profile: 7, Volatile: []string{"/ok", "no-slash", ""}, MaxDepth: -1, MaxBytes: -1,
	})
	require.Error(t, err)
	assert.NotErrorIs(t, err, idem.ErrInvalidBody)
	msg := err.Error()
	for _, want := range []string{"Profile", "Volatile[1]", "Volatile[2]", "MaxDepth", "MaxBytes"} {
		assert.Contains(t, msg, want)
	}
	assert.NotContains(t, msg, "Volatile[0]")
	for _, line := range strings.Split(msg, "\n") {
		assert.True(t, strings.HasPrefix(line, "idem: "), line)
	}

	_, err = idem.Request{Method: "POST", Body: []byte(`{}`), ContentType: "application/json"}.
		Fingerprint(idem.CanonicalOptions{Volatile: []string{"x"}})
	require.Error(t, err)
}

func TestProfileNames(t *testing.T) {
	for _, p := range []idem.Profile{idem.ProfileExact, idem.ProfileJCS} {
		got, err := idem.ParseProfile(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	assert.Equal(t, "exact", idem.Profile(0).String())
	_, err := idem.ParseProfile("EXACT")
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "idem: "))
}

func fingerprint(t *testing.T, r idem.Request, o idem.CanonicalOptions) idem.Fingerprint {
	t.Helper()
	fp, err := r.Fingerprint(o)
	require.NoError(t, err)
	return fp
}

func payment(body, contentType string) idem.Request {
	return idem.Request{Method: "POST", Path: "/v1/payments", Tenant: "acme", ContentType: contentType, Body: []byte(body)}
}

func TestFingerprintSameRequest(t *testing.T) {
	o := idem.CanonicalOptions{Volatile: []string{"/client_ts", "/items/*/trace_id"}}
	base := fingerprint(t, payment(`{"amount":4200,"currency":"eur","items":[{"sku":"a","trace_id":"1"}],"client_ts":1}`, "application/json"), o)
	same := []idem.Request{
		payment(`{"currency":"eur","amount":4200.0,"items":[{"trace_id":"2","sku":"a"}]}`, "application/json"),
		payment(` { "items" : [ { "sku" : "\u0061" } ] , "amount" : 4.2e3 , "currency" : "eur" , "client_ts" : 2 } `, "Application/JSON; charset=utf-8"),
		payment(`{"amount":42E2,"currency":"eur","items":[{"sku":"a"}]}`, "application/json"),
	}
	for i, r := range same {
		assert.Equal(t, base, fingerprint(t, r, o), "request %d", i)
	}
}

func TestFingerprintDifferentRequests(t *testing.T) {
	base := payment(`{"amount":9007199254740993}`, "application/json")
	variants := map[string]idem.Request{
		"amount off by one": payment(`{"amount":9007199254740992}`, "application/json"),
		"method":            {Method: "PUT", Path: base.Path, Tenant: base.Tenant, ContentType: base.ContentType, Body: base.Body},
		"method case":       {Method: "post", Path: base.Path, Tenant: base.Tenant, ContentType: base.ContentType, Body: base.Body},
		"path":              {Method: base.Method, Path: "/v1/refunds", Tenant: base.Tenant, ContentType: base.ContentType, Body: base.Body},
		"tenant":            {Method: base.Method, Path: base.Path, Tenant: "globex", ContentType: base.ContentType, Body: base.Body},
		"media type":        payment(`{"amount":9007199254740993}`, "application/vnd.acme+json"),
		"empty body":        payment(``, "application/json"),
		"empty object":      payment(`{}`, "application/json"),
		"null":              payment(`null`, "application/json"),
	}
	seen := map[idem.Fingerprint]string{fingerprint(t, base, idem.CanonicalOptions{}): "base"}
	for name, r := range variants {
		fp := fingerprint(t, r, idem.CanonicalOptions{})
		if other, dup := seen[fp]; dup {
			t.Errorf("%s and %s share fingerprint %s", name, other, fp)
		}
		seen[fp] = name
	}
	assert.Len(t, seen, len(variants)+1)
}

// Fields are length-framed: moving bytes from one field to the next must
// change the fingerprint.
func TestFingerprintFraming(t *testing.T) {
	a := idem.Request{Method: "PO", Path: "ST/x", Tenant: "t"}
	b := idem.Request{Method: "POST", Path: "/x", Tenant: "t"}
	c := idem.Request{Method: "POST", Path: "/x", Tenant: "", ContentType: "t"}
	fa, fb, fc := fingerprint(t, a, idem.CanonicalOptions{}), fingerprint(t, b, idem.CanonicalOptions{}), fingerprint(t, c, idem.CanonicalOptions{})
	assert.NotEqual(t, fa, fb)
	assert.NotEqual(t, fb, fc)
}

// The encoding is part of the stored data: a fingerprint written today
// must match the same request next year. This rebuilds the documented
// layout independently and pins one value.
func TestFingerprintEncoding(t *testing.T) {
	r := idem.Request{Method: "POST", Path: "/v1/payments", Tenant: "acme",
		ContentType: "application/json; charset=utf-8", Body: []byte(`{"b":2,"a":1}`)}
	var enc []byte
	enc = append(enc, "idem-fingerprint-v1\n"...)
	for _, f := range []string{"POST", "/v1/payments", "acme", "application/json", `{"a":1,"b":2}`} {
		enc = binary.BigEndian.AppendUint64(enc, uint64(len(f)))
		enc = append(enc, f...)
	}
	fp := fingerprint(t, r, idem.CanonicalOptions{})
	assert.Equal(t, idem.Fingerprint(sha256.Sum256(enc)), fp)
	assert.Equal(t, "2c812bf084c7e853a488e513e23118404ea3ab18ce0cd763a5fc247b546fc438", fp.String())
}

func TestFingerprintBodies(t *testing.T) {
	o := idem.CanonicalOptions{}
	form := func(b string) idem.Request { return payment(b, "application/x-www-form-urlencoded") }
	assert.Equal(t, fingerprint(t, form("b=2&a=x+y"), o), fingerprint(t, form("a=x%20y&b=2"), o))
	assert.NotEqual(t, fingerprint(t, form("a=1&a=2"), o), fingerprint(t, form("a=2&a=1"), o))

	text := func(b string) idem.Request { return payment(b, "text/plain") }
	assert.NotEqual(t, fingerprint(t, text(`{"a":1}`), o), fingerprint(t, text(`{ "a":1}`), o))
	// Raw bodies are not parsed, so JSON rules do not apply to them.
	fingerprint(t, text(`{"a":1,"a":1}`), o)

	_, err := payment(`{"a":1,"a":1}`, "application/problem+json").Fingerprint(o)
	require.ErrorIs(t, err, idem.ErrInvalidBody)
	_, err = form("a=%zz").Fingerprint(o)
	require.ErrorIs(t, err, idem.ErrInvalidBody)
	_, err = text("0123456789").Fingerprint(idem.CanonicalOptions{MaxBytes: 5})
	var be *idem.BodyError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "too_large", be.Code)

	body, err := payment(`{"b":1,"a":2}`, "application/json").CanonicalBody(o)
	require.NoError(t, err)
	assert.Equal(t, `{"a":2,"b":1}`, string(body))
	body, err = payment(``, "application/json").CanonicalBody(o)
	require.NoError(t, err)
	assert.Empty(t, body)
}

// TestRawFingerprint: a raw body is hashed as its bytes, and never as a
// canonical body, even one whose canonical form is those bytes.
func TestRawFingerprint(t *testing.T) {
	o := idem.CanonicalOptions{}
	raw := func(b, ct string) idem.Request {
		r := payment(b, ct)
		r.Raw = true
		return r
	}
	dup := raw(`{"a":1,"a":2}`, "application/json")
	assert.Equal(t, fingerprint(t, dup, o), fingerprint(t, raw(`{"a":1,"a":2}`, "application/json"), o))
	assert.NotEqual(t, fingerprint(t, dup, o), fingerprint(t, raw(`{"a":1, "a":2}`, "application/json"), o), "raw: every byte counts")
	assert.NotEqual(t, fingerprint(t, dup, o), fingerprint(t, raw(`{"a":1,"a":2}`, "text/plain"), o), "the media type still counts")

	canonical := payment(`{"b":1,"a":2}`, "application/json")
	form, err := canonical.CanonicalBody(o)
	require.NoError(t, err)
	assert.NotEqual(t, fingerprint(t, canonical, o), fingerprint(t, raw(string(form), "application/json"), o))
	text := payment("hello", "text/plain")
	assert.NotEqual(t, fingerprint(t, text, o), fingerprint(t, raw("hello", "text/plain"), o),
		"a raw type hashed raw is still of the other kind")

	body, err := raw(`{"a":1,"a":2}`, "application/json").CanonicalBody(o)
	require.NoError(t, err)
	assert.Equal(t, `{"a":1,"a":2}`, string(body))
}

// TestFingerprintContentEncoding: an encoded body of a type that is parsed
// is hashed as the bytes that arrived, with its codings; identity is no
// coding, so a request that names it hashes as one that does not, which
// is how every request without codings hashed before ContentEncoding
// existed.
func TestFingerprintContentEncoding(t *testing.T) {
	o := idem.CanonicalOptions{}
	coded := func(body, coding string) idem.Request {
		r := payment(body, "application/json")
		r.ContentEncoding = coding
		return r
	}
	gz := "\x1f\x8b\x08\x00 not JSON"
	fp := fingerprint(t, coded(gz, "gzip"), o)
	assert.Equal(t, fp, fingerprint(t, coded(gz, " GZip , identity"), o))
	assert.NotEqual(t, fp, fingerprint(t, coded(gz, "br"), o))
	assert.NotEqual(t, fp, fingerprint(t, coded(gz, "gzip, br"), o))
	form := coded(gz, "gzip")
	form.ContentType = "application/x-www-form-urlencoded"
	assert.NotEqual(t, fp, fingerprint(t, form, o))

	// Raw types were hashed as bytes before codings were read, codings or
	// not, and must still be: a key stored then keeps matching its retry.
	raw := payment(gz, "application/octet-stream")
	rawGzip := raw
	rawGzip.ContentEncoding = "gzip"
	assert.Equal(t, fingerprint(t, raw, o), fingerprint(t, rawGzip, o))

	plain := fingerprint(t, payment(`{"b":2,"a":1}`, "application/json"), o)
	assert.Equal(t, plain, fingerprint(t, coded(`{"a":1,"b":2}`, "identity"), o))
	assert.NotEqual(t, plain, fingerprint(t, coded(`{"a":1,"b":2}`, "gzip"), o), "a coded body is not canonicalized")
	body, err := coded(gz, "gzip").CanonicalBody(o)
	require.NoError(t, err)
	assert.Equal(t, gz, string(body))
}

func ExampleRequest_Fingerprint() {
	o := idem.CanonicalOptions{Volatile: []string{"/client_ts"}}
	first := idem.Request{Method: "POST", Path: "/v1/payments", Tenant: "acme",
		ContentType: "application/json", Body: []byte(`{"amount":4200,"currency":"eur","client_ts":1700000000}`)}
	retry := first
	retry.Body = []byte(`{"currency":"eur","amount":4.2e3,"client_ts":1700000007}`)
	other := first
	other.Body = []byte(`{"currency":"eur","amount":4201}`)

	a, _ := first.Fingerprint(o)
	b, _ := retry.Fingerprint(o)
	c, _ := other.Fingerprint(o)
	fmt.Println(a == b, a == c)
	// Output: true false
}

func ExampleCanonicalize() {
	out, err := idem.Canonicalize([]byte(`{"b": 4.20, "a": "\u00e9"}`), idem.CanonicalOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(out))

	_, err = idem.Canonicalize([]byte(`{"a": 1, "a": 2}`), idem.CanonicalOptions{})
	var be *idem.BodyError
	if errors.As(err, &be) {
		fmt.Println(be.Code, be.Offset)
	}
	// Output:
	// {"a":"é","b":4.2}
	// duplicate_member 9
}
