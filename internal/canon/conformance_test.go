package canon

import (
	"bufio"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vectors is the shared conformance suite beside the repository; it is not
// part of it, so the tests that need it skip when it is missing.
func vectors(t *testing.T) string {
	dir := filepath.Join("..", "..", "..", "shared", "vectors", "jcs")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("conformance vectors not present: %v", err)
	}
	return dir
}

func TestConformanceFiles(t *testing.T) {
	dir := vectors(t)
	inputs, err := filepath.Glob(filepath.Join(dir, "input", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, inputs)
	for _, in := range inputs {
		name := filepath.Base(in)
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(in)
			require.NoError(t, err)
			want, err := os.ReadFile(filepath.Join(dir, "output", name))
			require.NoError(t, err)
			assert.Equal(t, string(want), canon(t, string(src), Options{Profile: JCS}))
			if maxSignificantDigits(t, src) <= 15 {
				assert.Equal(t, string(want), canon(t, string(src), Options{}))
			}
			if hx, err := os.ReadFile(filepath.Join(dir, "outhex", strings.TrimSuffix(name, ".json")+".txt")); err == nil {
				b, err := hex.DecodeString(strings.Join(strings.Fields(string(hx)), ""))
				require.NoError(t, err)
				assert.Equal(t, b, want)
			}
		})
	}
}

// maxSignificantDigits scans the numbers of a valid document the crude way:
// it only has to tell the vectors with long numbers from the rest.
func maxSignificantDigits(t *testing.T, doc []byte) int {
	most := 0
	inString := false
	for i := 0; i < len(doc); i++ {
		c := doc[i]
		switch {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(doc) && strings.IndexByte("-+.eE0123456789", doc[j]) >= 0 {
				j++
			}
			most = max(most, significantDigits(doc[i:j]))
			i = j - 1
		}
	}
	return most
}

func significantDigits(num []byte) int {
	mant, _, _ := strings.Cut(strings.ToLower(string(num)), "e")
	d := strings.Trim(strings.NewReplacer("-", "", ".", "").Replace(mant), "0")
	return len(d)
}

func TestConformanceNumbers(t *testing.T) {
	f, err := os.Open(filepath.Join(vectors(t), "numbers.txt"))
	require.NoError(t, err)
	defer f.Close()
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		bits, want, ok := strings.Cut(sc.Text(), ",")
		require.True(t, ok, sc.Text())
		checkDouble(t, bits, want)
		lines++
	}
	require.NoError(t, sc.Err())
	assert.Equal(t, 10000, lines)
}

func TestConformanceAppendixB(t *testing.T) {
	f, err := os.Open(filepath.Join(vectors(t), "rfc8785", "appendix-b-numbers.csv"))
	require.NoError(t, err)
	defer f.Close()
	rows := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Split(line, ",")
		require.GreaterOrEqual(t, len(fields), 2, line)
		checkDouble(t, fields[0], fields[1])
		rows++
	}
	require.NoError(t, sc.Err())
	assert.Positive(t, rows)
}

// checkDouble feeds the double with the given bits to both profiles, spelled
// with 17 significant digits (always enough to name it) and as the expected
// string itself.
func checkDouble(t *testing.T, bits, want string) {
	t.Helper()
	u, err := strconv.ParseUint(bits, 16, 64)
	require.NoError(t, err, bits)
	v := math.Float64frombits(u)
	if want == "ERROR" {
		require.True(t, math.IsNaN(v) || math.IsInf(v, 0), bits)
		// No JSON spelling names NaN; the nearest things a client could
		// send must fail in both profiles.
		for _, in := range []string{"NaN", "Infinity", "-Infinity", "1e400", "-1e400"} {
			for _, p := range []Profile{Exact, JCS} {
				_, err := Append(nil, []byte(in), &Options{Profile: p})
				assert.Error(t, err, in)
			}
		}
		return
	}
	long := strconv.FormatFloat(v, 'e', 16, 64)
	for _, in := range []string{long, want} {
		out, err := Append(nil, []byte(in), &Options{Profile: JCS})
		require.NoError(t, err, in)
		assert.Equal(t, want, string(out), "jcs %s (%s)", in, bits)
	}
	// The expected string is already in ES layout, so the exact profile
	// must keep it, whatever its length.
	out, err := Append(nil, []byte(want), &Options{})
	require.NoError(t, err, want)
	assert.Equal(t, want, string(out), "exact %s", want)
	if significantDigits([]byte(want)) <= 15 {
		respelled := strings.Replace(strings.Replace(long, "e", "0E", 1), "E+", "E", 1)
		if significantDigits([]byte(long)) <= 15 {
			out, err = Append(nil, []byte(respelled), &Options{})
			require.NoError(t, err, respelled)
			assert.Equal(t, want, string(out), "exact %s", respelled)
		}
	}
}

func TestConformanceSorting(t *testing.T) {
	dir := filepath.Join(vectors(t), "rfc8785")
	src, err := os.ReadFile(filepath.Join(dir, "sorting-input.json"))
	require.NoError(t, err)
	order, err := os.ReadFile(filepath.Join(dir, "sorting-expected-value-order.txt"))
	require.NoError(t, err)
	out := canon(t, string(src), Options{Profile: JCS})
	var got []string
	for _, part := range strings.Split(strings.Trim(out, "{}"), `,"`) {
		_, v, ok := strings.Cut(part, `":`)
		require.True(t, ok, part)
		got = append(got, v)
	}
	assert.Equal(t, strings.Fields(strings.ReplaceAll(string(order), " ", "_")), underscore(got))
}

func underscore(v []string) []string {
	for i := range v {
		v[i] = strings.ReplaceAll(v[i], " ", "_")
	}
	return v
}

func TestConformanceSample(t *testing.T) {
	dir := filepath.Join(vectors(t), "rfc8785")
	src, err := os.ReadFile(filepath.Join(dir, "sample-3.2.2-input.json"))
	require.NoError(t, err)
	want, err := os.ReadFile(filepath.Join(dir, "sample-3.2.3-canonical.json"))
	require.NoError(t, err)
	hx, err := os.ReadFile(filepath.Join(dir, "sample-3.2.4-utf8.hex"))
	require.NoError(t, err)
	wantBytes, err := hex.DecodeString(strings.Join(strings.Fields(string(hx)), ""))
	require.NoError(t, err)
	got := canon(t, string(src), Options{Profile: JCS})
	assert.Equal(t, strings.TrimRight(string(want), "\n"), got)
	assert.Equal(t, wantBytes, []byte(got))
}

// The one property doubles cannot give: integers a double merges stay
// apart, and values that are equal stay together.
func TestExactKeepsApartWhatDoublesMerge(t *testing.T) {
	a := canon(t, `{"amount":9007199254740993}`, Options{})
	b := canon(t, `{"amount":9007199254740992}`, Options{})
	assert.NotEqual(t, a, b)
	assert.Equal(t, `{"amount":9007199254740993}`, a)
	assert.Equal(t, canon(t, `{"amount":9007199254740992}`, Options{Profile: JCS}),
		canon(t, `{"amount":9007199254740993}`, Options{Profile: JCS}))
}
