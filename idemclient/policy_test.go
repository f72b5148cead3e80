package idemclient_test

import (
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemclient"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	tests := []struct {
		name   string
		header string
		want   time.Duration
		wantOK bool
	}{
		{name: "absent", header: ""},
		{name: "delta seconds", header: "3", want: 3 * time.Second, wantOK: true},
		{name: "delta seconds with spaces", header: " 7 ", want: 7 * time.Second, wantOK: true},
		{name: "zero", header: "0", want: 0, wantOK: true},
		{name: "negative", header: "-1"},
		{name: "fraction", header: "1.5"},
		{name: "garbage", header: "soon"},
		{name: "IMF-fixdate", header: now.Add(5 * time.Second).Format(http.TimeFormat), want: 5 * time.Second, wantOK: true},
		{name: "RFC 850 date", header: "Wednesday, 04-Mar-26 05:06:17 GMT", want: 10 * time.Second, wantOK: true},
		{name: "asctime date", header: "Wed Mar  4 05:06:27 2026", want: 20 * time.Second, wantOK: true},
		{name: "date in the past", header: now.Add(-time.Hour).Format(http.TimeFormat), want: 0, wantOK: true},
		{name: "absurdly long", header: "99999999999999999999", want: time.Duration(1<<63 - 1), wantOK: true},
		{name: "longer than a Duration", header: "9999999999999", want: time.Duration(1<<63 - 1), wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{Header: http.Header{}}
			if tt.header != "" {
				resp.Header.Set("Retry-After", tt.header)
			}
			got, ok := idemclient.RetryAfter(resp, now)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestFullJitterBounds(t *testing.T) {
	const base, ceiling = 100 * time.Millisecond, 2 * time.Second
	b := idemclient.FullJitter(base, ceiling, rand.NewPCG(42, 7))
	for attempt := 1; attempt <= 8; attempt++ {
		upper := min(ceiling, base<<(attempt-1))
		lo, hi := upper, time.Duration(0)
		for range 500 {
			d := b(attempt, nil)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, upper)
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter uses the whole range, not a band near the top.
		assert.Less(t, lo, upper/10, "attempt %d", attempt)
		assert.Greater(t, hi, upper*9/10, "attempt %d", attempt)
	}
	// Far past the point where the doubling would overflow, the cap holds.
	assert.LessOrEqual(t, b(200, nil), ceiling)
	assert.LessOrEqual(t, b(0, nil), base)

	// The same seed gives the same waits.
	x := idemclient.FullJitter(base, ceiling, rand.NewPCG(3, 4))
	y := idemclient.FullJitter(base, ceiling, rand.NewPCG(3, 4))
	for attempt := 1; attempt <= 20; attempt++ {
		assert.Equal(t, x(attempt, nil), y(attempt, nil))
	}
}

func TestDefaultBackoffBounds(t *testing.T) {
	for attempt := 1; attempt <= 10; attempt++ {
		upper := min(idemclient.DefaultMaxDelay, idemclient.DefaultBaseDelay<<(attempt-1))
		for range 50 {
			d := idemclient.DefaultBackoff(attempt, nil)
			assert.GreaterOrEqual(t, d, time.Duration(0))
			assert.LessOrEqual(t, d, upper)
		}
	}
}

func TestDefaultKeysAreRandomUUIDs(t *testing.T) {
	a, err := idemclient.NewKey()
	require.NoError(t, err)
	b, err := idemclient.NewKey()
	require.NoError(t, err)
	assert.NotEqual(t, a, b)
	assert.Len(t, a, 36)
	assert.Equal(t, byte('4'), a[14], "version 4")
}

func TestProblemCode(t *testing.T) {
	resp := &http.Response{Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{"code":"outcome_pending","title":"x"}`))}
	assert.Equal(t, "", idemclient.ProblemCode(resp), "not problem+json")
	resp.Header.Set("Content-Type", "application/problem+json; charset=utf-8")
	assert.Equal(t, idem.CodeOutcomePending, idemclient.ProblemCode(resp))
	assert.Equal(t, idem.CodeOutcomePending, idemclient.ProblemCode(resp), "reading twice works")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, `{"code":"outcome_pending","title":"x"}`, string(body), "the body is put back")
}
