package canon

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func canon(t *testing.T, in string, o Options) string {
	t.Helper()
	out, err := Append(nil, []byte(in), &o)
	require.NoError(t, err)
	return string(out)
}

func TestAppendCanonicalForm(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"members sorted", `{"b":2,"a":1}`, `{"a":1,"b":2}`},
		{"nested and sorted at every level", `{"z":{"y":[3,{"q":1,"p":2}],"x":0},"a":[]}`, `{"a":[],"z":{"x":0,"y":[3,{"p":2,"q":1}]}}`},
		{"whitespace dropped", " \t\r\n{ \"a\" : [ 1 , true , false , null ] } \n", `{"a":[1,true,false,null]}`},
		{"scalars at top level", `"x"`, `"x"`},
		{"empty containers", `[{},[],{"a":{}}]`, `[{},[],{"a":{}}]`},
		{"escapes decoded where ES prints them bare", `"\u00e9\/\u0041\u007f"`, "\"é/A\x7f\""},
		{"short escapes kept", `"\b\f\n\r\t\"\\"`, `"\b\f\n\r\t\"\\"`},
		{"other controls as lower-case \\u00xx", `"\u001F\u0000\u000B"`, `"\u001f\u0000\u000b"`},
		{"surrogate pair decoded", `"\uD83D\uDE00"`, `"😀"`},
		{"no Unicode normalization", `"A\u030a"`, "\"A\u030a\""},
		// UTF-16 puts U+1F600 (0xD83D...) before U+E000; UTF-8 byte order would not.
		{"UTF-16 order, not bytes", "{\"\ue000\":1,\"😀\":2,\"\u00f6\":3,\"a\":4}", "{\"a\":4,\"\u00f6\":3,\"😀\":2,\"\ue000\":1}"},
		{"names compared after unescaping", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"a prefix sorts first", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{"escaped name re-escaped", `{"b\n":1,"b":2}`, `{"b":2,"b\n":1}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range []Profile{Exact, JCS} {
				assert.Equal(t, c.want, canon(t, c.in, Options{Profile: p}))
			}
		})
	}
}

func TestAppendNumbers(t *testing.T) {
	cases := []struct{ in, exact, jcs string }{
		{"4200", "4200", "4200"},
		{"4200.0", "4200", "4200"},
		{"4.2e3", "4200", "4200"},
		{"420000E-2", "4200", "4200"},
		{"-0", "0", "0"},
		{"-0.0e-5", "0", "0"},
		{"0e99999999999999999999", "0", "0"},
		{"1e21", "1e+21", "1e+21"},
		{"1e20", "100000000000000000000", "100000000000000000000"},
		{"0.000001", "0.000001", "0.000001"},
		{"0.0000001", "1e-7", "1e-7"},
		{"-1.25E+2", "-125", "-125"},
		{"1E30", "1e+30", "1e+30"},
		{"0.1", "0.1", "0.1"},
		{"100.000", "100", "100"},
		{"123.456e-300", "1.23456e-298", "1.23456e-298"},
		// Past 15 digits the profiles part: exact keeps what was written.
		{"9007199254740993", "9007199254740993", "9007199254740992"},
		{"333333333.33333329", "333333333.33333329", "333333333.3333333"},
		{"123456789012345678901234567890", "1.2345678901234567890123456789e+29", "1.2345678901234568e+29"},
		{"0.1000000000000000055511151231257827", "0.1000000000000000055511151231257827", "0.1"},
		// The edges of the exact profile's exponent range.
		{"9.99e308", "9.99e+308", ""},
		{"5e-324", "5e-324", "5e-324"},
		{"1e-324", "1e-324", "0"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			assert.Equal(t, c.exact, canon(t, c.in, Options{}))
			if c.jcs == "" {
				_, err := Append(nil, []byte(c.in), &Options{Profile: JCS})
				require.ErrorIs(t, err, ErrNumberOutOfRange)
				return
			}
			assert.Equal(t, c.jcs, canon(t, c.in, Options{Profile: JCS}))
		})
	}
}

func TestAppendRefuses(t *testing.T) {
	deep := strings.Repeat("[", 129) + strings.Repeat("]", 129)
	cases := []struct {
		name string
		in   string
		code Code
		off  int
	}{
		{"empty", "", ErrSyntax, 0},
		{"only whitespace", "  \n", ErrSyntax, 3},
		{"unclosed object", `{"a":1`, ErrSyntax, 6},
		{"trailing comma in array", `[1,]`, ErrSyntax, 3},
		{"trailing comma in object", `{"a":1,}`, ErrSyntax, 7},
		{"missing colon", `{"a" 1}`, ErrSyntax, 5},
		{"name not a string", `{1:2}`, ErrSyntax, 1},
		{"missing comma", `[1 2]`, ErrSyntax, 3},
		{"bad literal", `tru`, ErrSyntax, 0},
		{"capitalised literal", `True`, ErrSyntax, 0},
		{"single quotes", `'a'`, ErrSyntax, 0},
		{"unterminated string", `"abc`, ErrSyntax, 0},
		{"raw control character", "\"a\x01\"", ErrSyntax, 2},
		{"raw newline", "\"a\nb\"", ErrSyntax, 2},
		{"unknown escape", `"\q"`, ErrSyntax, 1},
		{"short \\u escape", `"\u12"`, ErrSyntax, 1},
		{"non-hex \\u escape", `"\u12g4"`, ErrSyntax, 1},

		{"duplicate", `{"a":1,"a":2}`, ErrDuplicateMember, 7},
		{"duplicate after unescaping", `{"a":1,"\u0061":2}`, ErrDuplicateMember, 7},
		{"duplicate surrogate pair vs raw", `{"😀":1,"\ud83d\ude00":2}`, ErrDuplicateMember, 10},
		{"duplicate far apart", `{"b":1,"a":2,"b":3}`, ErrDuplicateMember, 13},
		{"duplicate far apart, sorted at close", `{"c":1,"a":2,"b":3,"a":4}`, ErrDuplicateMember, 19},
		{"duplicate nested", `[{"x":{"k":1,"k":1}}]`, ErrDuplicateMember, 13},

		{"lone high surrogate", `"\ud800"`, ErrLoneSurrogate, 1},
		{"high surrogate then text", `"\ud800abcdef"`, ErrLoneSurrogate, 1},
		{"high surrogate then non-surrogate escape", `"\ud800\u0041"`, ErrLoneSurrogate, 1},
		{"two high surrogates", `"\ud800\ud800"`, ErrLoneSurrogate, 1},
		{"lone low surrogate", `"a\udfff"`, ErrLoneSurrogate, 2},
		{"reversed pair", `"\udc00\ud800"`, ErrLoneSurrogate, 1},
		{"lone surrogate in a name", `{"\ud800":1}`, ErrLoneSurrogate, 2},
		{"raw high surrogate", "\"\xed\xa0\x80\"", ErrInvalidUTF8, 1},
		{"raw reversed pair", "\"\xed\xb0\x80\xed\xa0\x80\"", ErrInvalidUTF8, 1},

		{"stray continuation byte", "\"\x80\"", ErrInvalidUTF8, 1},
		{"lead byte without continuation", "\"\xc3(\"", ErrInvalidUTF8, 1},
		{"truncated three-byte sequence", "\"\xe2\x82\"", ErrInvalidUTF8, 1},
		{"truncated at end of input", "\"ab\xe2\x82", ErrInvalidUTF8, 3},
		{"overlong two-byte", "\"\xc0\xaf\"", ErrInvalidUTF8, 1},
		{"overlong C1", "\"\xc1\xbf\"", ErrInvalidUTF8, 1},
		{"overlong three-byte", "\"\xe0\x80\xaf\"", ErrInvalidUTF8, 1},
		{"overlong four-byte", "\"\xf0\x80\x80\xaf\"", ErrInvalidUTF8, 1},
		{"above U+10FFFF", "\"\xf4\x90\x80\x80\"", ErrInvalidUTF8, 1},
		{"five-byte form", "\"\xf8\x88\x80\x80\x80\"", ErrInvalidUTF8, 1},
		{"byte 0xff", "\"a\xff\"", ErrInvalidUTF8, 2},
		{"bad UTF-8 in a name", "{\"\xfe\":1}", ErrInvalidUTF8, 2},
		{"bad UTF-8 outside strings", "[\x80]", ErrInvalidUTF8, 1},

		{"BOM", "\xef\xbb\xbf{}", ErrBOM, 0},
		{"BOM after whitespace is just a stray character", " \xef\xbb\xbf{}", ErrSyntax, 1},

		{"NaN", `NaN`, ErrInvalidNumber, 0},
		{"Infinity", `[Infinity]`, ErrInvalidNumber, 1},
		{"-Infinity", `-Infinity`, ErrInvalidNumber, 0},
		{"plus sign", `+1`, ErrInvalidNumber, 0},
		{"leading dot", `.5`, ErrInvalidNumber, 0},
		{"trailing dot", `1.`, ErrInvalidNumber, 0},
		{"empty exponent", `1e`, ErrInvalidNumber, 0},
		{"signed empty exponent", `1e+`, ErrInvalidNumber, 0},
		{"leading zero", `01`, ErrInvalidNumber, 0},
		{"negative leading zero", `-01`, ErrInvalidNumber, 0},
		{"hex", `0x10`, ErrInvalidNumber, 0},
		{"two points", `[1.5.3]`, ErrInvalidNumber, 1},
		{"lone minus", `-`, ErrInvalidNumber, 0},

		{"exponent past the bound", `1e309`, ErrNumberOutOfRange, 0},
		{"exponent below the bound", `[9e-325]`, ErrNumberOutOfRange, 1},
		{"digits push the exponent past the bound", `10000e305`, ErrNumberOutOfRange, 0},
		{"huge exponent", `1e99999999999999999999999999`, ErrNumberOutOfRange, 0},

		{"depth", deep, ErrDepthExceeded, 128},
		{"depth mixed", strings.Repeat(`{"a":[`, 65), ErrDepthExceeded, 384},

		{"second document", `{} {}`, ErrTrailingData, 3},
		{"second string", `"a""b"`, ErrTrailingData, 3},
		{"NUL after the value", "1\x00", ErrTrailingData, 1},
		{"closing bracket too many", `[1]]`, ErrTrailingData, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := Append([]byte("keep"), []byte(c.in), &Options{})
			require.ErrorIs(t, err, c.code)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, c.code, e.Code)
			assert.Equal(t, c.off, e.Offset)
			assert.Equal(t, "keep", string(out))
			assert.True(t, strings.HasPrefix(err.Error(), "canon: "+string(c.code)+" at byte "), err.Error())
		})
	}
}

func TestAppendLimits(t *testing.T) {
	ok := strings.Repeat("[", 128) + strings.Repeat("]", 128)
	assert.Equal(t, ok, canon(t, ok, Options{}))

	_, err := Append(nil, []byte(`[[1]]`), &Options{MaxDepth: 1})
	require.ErrorIs(t, err, ErrDepthExceeded)
	assert.Equal(t, `[[1]]`, canon(t, `[[1]]`, Options{MaxDepth: 2}))

	_, err = Append(nil, []byte(`[1,2]`), &Options{MaxBytes: 4})
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Equal(t, `[1]`, canon(t, `[1]`, Options{MaxBytes: 3}))
}

func TestAppendVolatile(t *testing.T) {
	doc := `{"z":0,"client_ts":"2024-01-01","items":[{"trace_id":"t1","sku":"a"},{"sku":"b","trace_id":"t2"},7],` +
		`"a/b":1,"m~n":2,"*":3,"nested":{"client_ts":4}}`
	cases := []struct {
		name     string
		pointers []string
		want     string
	}{
		{"none", nil, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"a","trace_id":"t1"},{"sku":"b","trace_id":"t2"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"top-level member only", []string{"/client_ts"}, `{"*":3,"a/b":1,"items":[{"sku":"a","trace_id":"t1"},{"sku":"b","trace_id":"t2"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"wildcard over array elements", []string{"/items/*/trace_id"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"a"},{"sku":"b"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"array index", []string{"/items/1"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"a","trace_id":"t1"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"first element", []string{"/items/0"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"b","trace_id":"t2"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"every element", []string{"/items/*"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"escaped tokens", []string{"/a~1b", "/m~0n"}, `{"*":3,"client_ts":"2024-01-01","items":[{"sku":"a","trace_id":"t1"},{"sku":"b","trace_id":"t2"},7],"nested":{"client_ts":4},"z":0}`},
		{"wildcard at the top drops everything", []string{"/*"}, `{}`},
		{"deeper than the value goes", []string{"/z/x", "/items/2/x"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"a","trace_id":"t1"},{"sku":"b","trace_id":"t2"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"leading-zero index matches no element", []string{"/items/01"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"a","trace_id":"t1"},{"sku":"b","trace_id":"t2"},7],"m~n":2,"nested":{"client_ts":4},"z":0}`},
		{"a container, and overlapping pointers", []string{"/nested", "/nested/client_ts", "/*/client_ts"}, `{"*":3,"a/b":1,"client_ts":"2024-01-01","items":[{"sku":"a","trace_id":"t1"},{"sku":"b","trace_id":"t2"},7],"m~n":2,"z":0}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, canon(t, doc, Options{Volatile: c.pointers}))
		})
	}
}

func TestAppendVolatileStillChecksTheWholeDocument(t *testing.T) {
	o := &Options{Volatile: []string{"/x"}}
	_, err := Append(nil, []byte(`{"x":{"a":1,"a":2}}`), o)
	require.ErrorIs(t, err, ErrDuplicateMember)
	_, err = Append(nil, []byte(`{"x":1,"y":2,"x":3}`), o)
	require.ErrorIs(t, err, ErrDuplicateMember)
	_, err = Append(nil, []byte(`{"x":"\ud800"}`), o)
	require.ErrorIs(t, err, ErrLoneSurrogate)
}

func TestPointerTokens(t *testing.T) {
	var toks []string
	require.NoError(t, eachToken("/a~1b/~0/*//~01", func(s string) { toks = append(toks, s) }))
	assert.Equal(t, []string{"a/b", "~", "*", "", "~1"}, toks)
	for _, bad := range []string{"", "a", "/~", "/~2", "/a~"} {
		assert.Error(t, CheckPointer(bad), bad)
		_, err := Append(nil, []byte(`{}`), &Options{Volatile: []string{bad}})
		assert.Error(t, err, bad)
	}
}

func TestCompareUTF16(t *testing.T) {
	words := []string{"", "a", "ab", "b", "\u007f", "\u0080", "\u00f6", "\u20ac", "\ud7ff", "\ue000", "\ufb33", "\uffff",
		"\U00010000", "😀", "😂", "\U0010ffff", "a\ue000", "a😀", "€a", "€b"}
	for _, a := range words {
		for _, b := range words {
			want := compareUnits(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
			assert.Equal(t, want, compareUTF16([]byte(a), []byte(b)), "%q vs %q", a, b)
		}
	}
}

func compareUnits(a, b []uint16) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

func TestAppendForm(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"sorted by name", "b=2&a=1", "a=1&b=2"},
		{"repeated names keep their order", "tag=z&a=1&tag=y", "a=1&tag=z&tag=y"},
		{"decoded then encoded one way", "n=J%c3%a9r%C3%B4me+x&e=%7e%41", "e=~A&n=J%C3%A9r%C3%B4me%20x"},
		{"empty segments ignored", "&a=1&&b=&", "a=1&b="},
		{"name without value", "flag&a=1", "a=1&flag="},
		{"equals sign in a value", "a=b=c", "a=b%3Dc"},
		{"empty", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := AppendForm(nil, []byte(c.in), 0)
			require.NoError(t, err)
			assert.Equal(t, c.want, string(out))
		})
	}
	_, err := AppendForm(nil, []byte("a=1&b=%zz"), 0)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, ErrSyntax, e.Code)
	assert.Equal(t, 6, e.Offset)
	_, err = AppendForm(nil, []byte("a=%4"), 0)
	require.ErrorIs(t, err, ErrSyntax)
	_, err = AppendForm(nil, []byte("a=12345"), 4)
	require.ErrorIs(t, err, ErrTooLarge)
}

func TestErrorMatching(t *testing.T) {
	_, err := Append(nil, []byte(`{"a":1,"a":2}`), &Options{})
	assert.True(t, errors.Is(err, ErrDuplicateMember))
	assert.False(t, errors.Is(err, ErrSyntax))
	assert.Equal(t, `canon: duplicate_member at byte 7: member "a" appears more than once`, err.Error())
}

// The pooled parser state must never leak between calls, including calls
// that fail half-way.
func TestAppendConcurrent(t *testing.T) {
	docs := []struct{ in, want string }{
		{`{"b":[{"d":1,"c":2}],"a":"\u00e9"}`, `{"a":"é","b":[{"c":2,"d":1}]}`},
		{`[1.50,{"z":{},"y":[]}]`, `[1.5,{"y":[],"z":{}}]`},
		{`{"a":1,"b":{"x":1,"x":2}}`, ""},
		{strings.Repeat(`{"k":`, 200), ""},
	}
	done := make(chan error)
	for g := range 8 {
		go func() {
			for i := range 200 {
				d := docs[(g+i)%len(docs)]
				out, err := Append(nil, []byte(d.in), &Options{})
				if (err == nil) != (d.want != "") || string(out) != d.want {
					done <- fmt.Errorf("%s: got %q, %v", d.in, out, err)
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		assert.NoError(t, <-done)
	}
}
