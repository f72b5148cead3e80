package canon

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

var fuzzSeeds = []string{
	`{"b":2,"a":[1,4200.0,4.2e3,-0,1e21,1e-7,{"z":null,"y":true}],"\u00e9":"\ud83d\ude00\n"}`,
	`[9007199254740993,333333333.33333329,1E30,0.000000000000000000000000001]`,
	`{"a":1,"a":2}`,
	`"\ud800"`,
	"\xef\xbb\xbf{}",
	`[[[[[[[[[[]]]]]]]]]]`,
	`{"\ue000":1,"😀":2}`,
	`1e400`,
}

// checkError holds every refusal to its contract: an *Error with a code
// and an offset inside the input.
func checkError(t *testing.T, err error, n int) {
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not an *Error", err)
	}
	if e.Code == "" || e.Offset < 0 || e.Offset > n {
		t.Fatalf("error %+v for %d bytes of input", e, n)
	}
	if !errors.Is(err, e.Code) {
		t.Fatalf("errors.Is does not match %q", e.Code)
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		for _, p := range []Profile{Exact, JCS} {
			o := &Options{Profile: p, MaxDepth: 32}
			out, err := Append(nil, src, o)
			if err != nil {
				checkError(t, err, len(src))
				continue
			}
			if !json.Valid(out) {
				t.Fatalf("profile %d: output %q is not JSON", p, out)
			}
			again, err := Append(nil, out, o)
			if err != nil || string(again) != string(out) {
				t.Fatalf("profile %d: not idempotent: %q -> %q (%v)", p, out, again, err)
			}
		}
	})
}

func FuzzVolatile(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), "/a")
	}
	f.Add([]byte(`{"items":[{"trace_id":1,"x":2},{"x":3}],"client_ts":0}`), "/items/*/trace_id")
	f.Add([]byte(`[{"a~b":1},{"c/d":2}]`), "/*/a~0b")
	f.Fuzz(func(t *testing.T, src []byte, ptr string) {
		if err := CheckPointer(ptr); err != nil {
			return
		}
		o := &Options{Volatile: []string{ptr}}
		out, err := Append(nil, src, o)
		if err != nil {
			checkError(t, err, len(src))
			return
		}
		// Dropping commutes with canonicalizing: dropping from the
		// canonical form again removes nothing more.
		full, err := Append(nil, src, &Options{})
		if err != nil {
			t.Fatalf("valid with a pointer but not without: %v", err)
		}
		fromFull, err := Append(nil, full, o)
		if err != nil || string(fromFull) != string(out) {
			t.Fatalf("%q then %q gives %q, directly %q (%v)", full, ptr, fromFull, out, err)
		}
	})
}

func FuzzForm(f *testing.F) {
	f.Add([]byte("b=2&a=1&a=0"))
	f.Add([]byte("n=J%c3%a9r%C3%B4me+x&&flag"))
	f.Add([]byte("a=%zz"))
	f.Fuzz(func(t *testing.T, src []byte) {
		out, err := AppendForm(nil, src, 0)
		if err != nil {
			checkError(t, err, len(src))
			return
		}
		again, err := AppendForm(nil, out, 0)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q (%v)", out, again, err)
		}
	})
}

func FuzzCompareUTF16(f *testing.F) {
	f.Add("\ue000", "😀")
	f.Add("a", "ab")
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			return
		}
		want := compareUnits(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		if got := compareUTF16([]byte(a), []byte(b)); got != want {
			t.Fatalf("%q vs %q: got %d, want %d", a, b, got, want)
		}
	})
}
