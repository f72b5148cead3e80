// Package fuzz holds the property-based fuzz targets that span packages.
// Run one with: go test -run=^$ -fuzz=^FuzzName$ -fuzztime=30s ./fuzz/
package fuzz

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/assert"

	"github.com/idemkv/idem"
)

var seeds = []string{
	`{"amount":4200,"currency":"eur","items":[{"sku":"a","qty":2,"price":19.99}],"note":"J\u00e9r\u00f4me \ud83d\ude00"}`,
	`[9007199254740993,333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001,-0]`,
	`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew","1":"One","\ud83d\ude00":"Emoji","\u0080":"Control","\u00f6":"o"}`,
	`{"a":{"b":{"c":[[],{},[{}]]}},"":null,"t":true,"f":false}`,
	`"\u0000\u001f\b\f\n\r\t\"\\\/"`,
	`{"a":1,"a":2}`,
	`1e400`,
	"\xef\xbb\xbf{}",
}

func request(body []byte) idem.Request {
	return idem.Request{Method: "POST", Path: "/v1/payments", Tenant: "acme", ContentType: "application/json", Body: body}
}

// FuzzIdentity: the canonical form is a fixed point, and the fingerprint of
// a body equals the fingerprint of its canonical form.
func FuzzIdentity(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		for _, p := range []idem.Profile{idem.ProfileExact, idem.ProfileJCS} {
			o := idem.CanonicalOptions{Profile: p}
			out, err := idem.Canonicalize(src, o)
			if err != nil {
				continue
			}
			again, err := idem.Canonicalize(out, o)
			if err != nil || !bytes.Equal(out, again) {
				t.Fatalf("%s: canonical form %q canonicalizes to %q (%v)", p, out, again, err)
			}
			a, err1 := request(src).Fingerprint(o)
			b, err2 := request(out).Fingerprint(o)
			if err1 != nil || err2 != nil || a != b {
				t.Fatalf("%s: fingerprints of %q and its canonical form differ (%v, %v)", p, src, err1, err2)
			}
		}
	})
}

// FuzzRespelled: writing the same document again with members shuffled,
// numbers spelled differently, other whitespace and other string escapes
// gives the same fingerprint; changing one number's value does not.
func FuzzRespelled(f *testing.F) {
	for i, s := range seeds {
		f.Add([]byte(s), uint64(i))
	}
	f.Fuzz(func(t *testing.T, src []byte, seed uint64) {
		// An empty body is a valid request but not a JSON document.
		if _, err := idem.Canonicalize(src, idem.CanonicalOptions{}); err != nil {
			return
		}
		want, err := request(src).Fingerprint(idem.CanonicalOptions{})
		if err != nil {
			t.Fatalf("canonicalizes but does not fingerprint: %v", err)
		}
		dec := json.NewDecoder(bytes.NewReader(src))
		dec.UseNumber()
		var doc any
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("accepted by idem, refused by encoding/json: %v", err)
		}
		w := writer{r: rand.New(rand.NewPCG(seed, seed>>32))}
		w.value(doc)
		got, err := request(w.buf.Bytes()).Fingerprint(idem.CanonicalOptions{})
		if err != nil || got != want {
			t.Fatalf("respelled %q as %q: fingerprint differs (%v)", src, w.buf.Bytes(), err)
		}

		w = writer{r: rand.New(rand.NewPCG(seed, seed>>32)), mutate: true}
		w.value(doc)
		if !w.mutated {
			return
		}
		other, err := request(w.buf.Bytes()).Fingerprint(idem.CanonicalOptions{})
		if err == nil && other == want {
			t.Fatalf("changed a number in %q (%q) but the fingerprint stayed", src, w.buf.Bytes())
		}
	})
}

// writer serializes a decoded document in a random but equivalent
// spelling. With mutate set it changes the value of the first number it
// writes.
type writer struct {
	buf     bytes.Buffer
	r       *rand.Rand
	mutate  bool
	mutated bool
}

func (w *writer) space() {
	for range w.r.IntN(3) {
		w.buf.WriteByte(" \t\n\r"[w.r.IntN(4)])
	}
}

func (w *writer) value(v any) {
	w.space()
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys) // map order is random; make the shuffle depend on the seed alone
		w.r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		w.buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			w.space()
			w.str(k)
			w.space()
			w.buf.WriteByte(':')
			w.value(v[k])
		}
		w.space()
		w.buf.WriteByte('}')
	case []any:
		w.buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			w.value(e)
		}
		w.space()
		w.buf.WriteByte(']')
	case string:
		w.str(v)
	case json.Number:
		w.number(string(v))
	case bool:
		w.buf.WriteString(strconv.FormatBool(v))
	case nil:
		w.buf.WriteString("null")
	}
	w.space()
}

func (w *writer) str(s string) {
	w.buf.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			if w.r.IntN(2) == 0 {
				w.buf.WriteByte('\\')
				w.buf.WriteRune(r)
			} else {
				w.u(r)
			}
		case r < 0x20:
			w.u(r)
		case r >= 0x10000 && w.r.IntN(3) == 0:
			r -= 0x10000
			w.u(0xD800 + r>>10)
			w.u(0xDC00 + r&0x3FF)
		case r < 0x10000 && w.r.IntN(4) == 0:
			w.u(r)
		case r == '/' && w.r.IntN(2) == 0:
			w.buf.WriteString(`\/`)
		default:
			w.buf.WriteRune(r)
		}
	}
	w.buf.WriteByte('"')
}

func (w *writer) u(r rune) {
	const hex = "0123456789abcdef0123456789ABCDEF"
	up := 16 * w.r.IntN(2)
	w.buf.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		w.buf.WriteByte(hex[up+int(r>>shift&0xF)])
	}
}

// number writes the decimal value of lit, digits d times 10^e, as
// int.frac e exp with the point moved and zeros added at random.
func (w *writer) number(lit string) {
	neg, d, e := decimal(lit)
	if w.mutate && !w.mutated {
		w.mutated = true
		if d == "" {
			d = "1"
		} else {
			last := d[len(d)-1]
			d = d[:len(d)-1] + string('0'+(last-'0'+1)%10)
		}
		d = strings.TrimRight(d, "0")
		if d == "" {
			d = "2"
		}
	}
	if neg && (d != "" || w.r.IntN(2) == 0) {
		w.buf.WriteByte('-')
	}
	if d == "" {
		w.buf.WriteString([]string{"0", "0.0", "0e7", "0.000E-2"}[w.r.IntN(4)])
		return
	}
	z := w.r.IntN(3)
	d += strings.Repeat("0", z)
	e -= z
	p := w.r.IntN(len(d) + 1)
	intPart, frac := d[:p], d[p:]
	if intPart == "" {
		intPart = "0"
		frac = strings.Repeat("0", w.r.IntN(3)) + frac
	}
	w.buf.WriteString(intPart)
	if frac != "" {
		w.buf.WriteByte('.')
		w.buf.WriteString(frac)
	}
	exp := e + len(frac)
	if exp == 0 && w.r.IntN(2) == 0 {
		return
	}
	w.buf.WriteByte("eE"[w.r.IntN(2)])
	switch {
	case exp < 0:
		w.buf.WriteByte('-')
		exp = -exp
	case w.r.IntN(2) == 0:
		w.buf.WriteByte('+')
	}
	w.buf.WriteString(strings.Repeat("0", w.r.IntN(2)))
	w.buf.WriteString(strconv.Itoa(exp))
}

// decimal splits a JSON number into its sign, its significant digits
// without leading or trailing zeros ("" for zero) and the power of ten
// they are multiplied by.
func decimal(lit string) (neg bool, d string, e int) {
	if lit[0] == '-' {
		neg, lit = true, lit[1:]
	}
	mant, expPart, hasExp := strings.Cut(strings.ToLower(lit), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	d = intPart + frac
	trimmed := strings.TrimRight(d, "0")
	e = len(d) - len(trimmed) - len(frac)
	if d = strings.TrimLeft(trimmed, "0"); d == "" {
		return neg, "", 0 // zero, whatever its exponent says
	}
	if hasExp {
		x, err := strconv.Atoi(expPart)
		if err != nil {
			// Only the jcs profile accepts such exponents (as 0 or an
			// error); saturating keeps them out of every range check.
			x = 1 << 30
			if expPart[0] == '-' {
				x = -x
			}
		}
		e += x
	}
	return neg, d, e
}

// FuzzNeverPanics: whatever the body, media type and volatile pointer,
// fingerprinting returns a result or an error, and a body error points
// inside the body.
func FuzzNeverPanics(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s), "application/json", "/a")
	}
	f.Add([]byte("b=2&a=%zz"), "application/x-www-form-urlencoded", "")
	f.Add([]byte(`{"items":[{"trace_id":1}]}`), "application/vnd.x+json; charset=utf-8", "/items/*/trace_id")
	f.Fuzz(func(t *testing.T, body []byte, contentType, pointer string) {
		r := request(body)
		r.ContentType = contentType
		for _, p := range []idem.Profile{idem.ProfileExact, idem.ProfileJCS} {
			// Most random strings are not pointers; make them one so the
			// body still gets parsed, and fall back to none if "~" spoils it.
			o := idem.CanonicalOptions{Profile: p, Volatile: []string{"/" + strings.TrimPrefix(pointer, "/")}, MaxDepth: 16, MaxBytes: 1 << 12}
			_, err := r.Fingerprint(o)
			var be *idem.BodyError
			if err != nil && !errors.As(err, &be) {
				o.Volatile = nil
				_, err = r.Fingerprint(o)
			}
			if errors.As(err, &be) && (be.Offset < 0 || be.Offset > len(body) || be.Code == "") {
				t.Fatalf("body error %+v for %d bytes", be, len(body))
			}
			if _, err := idem.Canonicalize(body, o); err != nil && !strings.HasPrefix(err.Error(), "idem: ") {
				t.Fatalf("error without the package prefix: %v", err)
			}
		}
	})
}

// FuzzDifferentialJCS compares the jcs profile with gowebpki/jcs, an
// independent RFC 8785 implementation, on every document both accept, and
// the exact profile with both on documents whose numbers a double holds
// exactly as written (15 significant digits, normal exponent).
func FuzzDifferentialJCS(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		ours, err := idem.Canonicalize(src, idem.CanonicalOptions{Profile: idem.ProfileJCS})
		if err != nil {
			return
		}
		theirs, err := jcs.Transform(src)
		if err != nil {
			t.Fatalf("idem accepts %q, gowebpki/jcs refuses it: %v", src, err)
		}
		if !bytes.Equal(ours, theirs) {
			t.Fatalf("%q: idem jcs %q, gowebpki/jcs %q", src, ours, theirs)
		}
		if !doubleSafe(t, src) {
			return
		}
		exact, err := idem.Canonicalize(src, idem.CanonicalOptions{})
		if err != nil || !bytes.Equal(exact, theirs) {
			t.Fatalf("%q: idem exact %q, gowebpki/jcs %q (%v)", src, exact, theirs, err)
		}
	})
}

func doubleSafe(t *testing.T, src []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			t.Fatalf("accepted by idem, refused by encoding/json: %v", err)
		}
		n, ok := tok.(json.Number)
		if !ok {
			continue
		}
		_, d, e := decimal(string(n))
		if d == "" {
			continue
		}
		if sci := e + len(d) - 1; len(d) > 15 || sci < -307 || sci > 308 {
			return false
		}
	}
}

func TestDecimal(t *testing.T) {
	cases := []struct {
		lit string
		neg bool
		d   string
		e   int
	}{
		{"4200.0", false, "42", 2},
		{"-0.00120e+3", true, "12", -1},
		{"0", false, "", 0},
		{"-0.0e99999999999999999999", true, "", 0},
		{"1E30", false, "1", 30},
		{"1e-70000000000000000000000000000", false, "1", -1 << 30},
	}
	for _, c := range cases {
		t.Run(c.lit, func(t *testing.T) {
			neg, d, e := decimal(c.lit)
			assert.Equal(t, c.neg, neg)
			assert.Equal(t, c.d, d)
			assert.Equal(t, c.e, e)
		})
	}
}
