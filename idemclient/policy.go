package idemclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/idemkv/idem"
)

// CheckRetry decides whether an attempt should be repeated. It gets the
// request's context and either the response or the transport error of the
// attempt (exactly one is non-nil). Returning true retries with the same key;
// returning false with a nil error ends the call with this outcome; a non-nil
// error ends it with that error, wrapped in a *RetryError.
//
// A CheckRetry may read resp.Body only if it puts back what it read, as
// ProblemCode does: a response that is not retried reaches the caller.
type CheckRetry func(ctx context.Context, resp *http.Response, err error) (bool, error)

// Backoff returns how long to wait before the next attempt, given how many
// attempts have been made so far (1 after the first) and the last response
// (nil after a transport error). The Transport waits at least as long as
// the server's Retry-After asks, whatever Backoff returns.
type Backoff func(attempt int, resp *http.Response) time.Duration

// Definitive reports whether a response settles its operation, so that a
// KeyStore may record the operation as done. It is asked only about
// responses that are not going to be retried.
type Definitive func(resp *http.Response) bool

// DefaultCheckRetry retries transport errors (a refused or reset connection,
// a timeout) and the statuses that say the attempt may be repeated: 408,
// 425, 429, 500, 502, 503, 504, and 409 whose problem code is
// request_in_progress. Everything else is final, in particular 422 (the key
// belongs to another request) and 409 outcome_pending. It stops as soon as
// ctx is done, and does not retry certificate errors, which no retry fixes.
func DefaultCheckRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if cerr := ctx.Err(); cerr != nil {
		return false, cerr
	}
	if err != nil {
		var verr *tls.CertificateVerificationError
		var uerr x509.UnknownAuthorityError
		var herr x509.HostnameError
		if errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) {
			return false, err
		}
		return true, nil
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, nil
	case http.StatusConflict:
		return ProblemCode(resp) == idem.CodeInProgress, nil
	}
	return false, nil
}

// DefaultDefinitive treats as definitive every 2xx and every 4xx that the
// client should not simply repeat, such as 400, 404 and 422. It leaves out
// the answers that say the operation is still open: 401 and 403 (the
// credentials must be fixed, then the same key sent again), 408, 425 and
// 429, and 409 (in progress, or an outcome the server has yet to resolve).
// 3xx and 5xx are never definitive: the operation has not finished, or the
// server does not know whether it has.
func DefaultDefinitive(resp *http.Response) bool {
	s := resp.StatusCode
	switch {
	case s >= 200 && s < 300:
		return true
	case s >= 400 && s < 500:
		switch s {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout,
			http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
			return false
		}
		return true
	}
	return false
}

// Bounds of DefaultBackoff.
const (
	DefaultBaseDelay = 100 * time.Millisecond
	DefaultMaxDelay  = 10 * time.Second
)

// DefaultBackoff is FullJitter(DefaultBaseDelay, DefaultMaxDelay, nil).
func DefaultBackoff(attempt int, resp *http.Response) time.Duration {
	return jitter(DefaultBaseDelay, DefaultMaxDelay, attempt, rand.Int64N)
}

// FullJitter returns an exponential backoff with full jitter: after attempt
// n it waits a uniformly random time between zero and base·2^(n-1), capped
// at ceiling. Drawing from the whole range, rather than adding a little noise
// to a fixed delay, keeps clients that failed together from retrying
// together. src supplies the randomness (tests pass a seeded one, such as
// rand.NewPCG); nil uses the automatically seeded global source. The
// returned Backoff is safe for concurrent use.
func FullJitter(base, ceiling time.Duration, src rand.Source) Backoff {
	if src == nil {
		return func(attempt int, _ *http.Response) time.Duration {
			return jitter(base, ceiling, attempt, rand.Int64N)
		}
	}
	var mu sync.Mutex // rand.Rand is not safe for concurrent use
	r := rand.New(src)
	draw := func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Int64N(n)
	}
	return func(attempt int, _ *http.Response) time.Duration {
		return jitter(base, ceiling, attempt, draw)
	}
}

// jitter draws the wait after attempt from [0, min(ceiling, base·2^(attempt-1))].
func jitter(base, ceiling time.Duration, attempt int, draw func(int64) int64) time.Duration {
	if base <= 0 || ceiling <= 0 {
		return 0
	}
	upper := ceiling
	// Shift only while the result stays under the ceiling, so it never
	// overflows.
	if shift := max(attempt-1, 0); shift < 63 && base <= ceiling>>shift {
		upper = base << shift
	}
	return time.Duration(draw(int64(upper) + 1))
}

// RetryAfter returns the wait a response's Retry-After header asks for, in
// either form RFC 9110 allows: delta-seconds or an HTTP-date, measured from
// now. A date in the past means no wait. ok is false when the header is
// absent or unreadable.
func RetryAfter(resp *http.Response, now time.Time) (d time.Duration, ok bool) {
	if resp == nil {
		return 0, false
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	secs, err := strconv.ParseUint(v, 10, 63)
	switch {
	case errors.Is(err, strconv.ErrRange) || err == nil && secs > uint64(math.MaxInt64/time.Second):
		// Saturate instead of overflowing: an absurd value is still "long".
		return time.Duration(math.MaxInt64), true
	case err == nil:
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// maxProblemBytes bounds how much of a body ProblemCode reads: problem
// documents are small, and a large body is not one worth decoding.
const maxProblemBytes = 64 << 10

// ProblemCode returns the "code" member of an application/problem+json
// response body (RFC 9457), or "" if the response is not one or has none.
// It reads at most 64 KiB and puts the bytes back, so resp.Body still reads
// from the start afterwards.
func ProblemCode(resp *http.Response) string {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return ""
	}
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		return ""
	}
	buf, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes))
	resp.Body = rereadBody{io.MultiReader(bytes.NewReader(buf), resp.Body), resp.Body}
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(buf, &p) != nil {
		return ""
	}
	return p.Code
}

// rereadBody is a response body with its first bytes put back in front.
type rereadBody struct {
	io.Reader
	io.Closer
}

// NewKey returns a fresh random (version 4) UUID read from crypto/rand:
// 122 random bits, so that no two operations ever share a key by chance.
// It is the default Options.NewKey.
func NewKey() (string, error) {
	u, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}
