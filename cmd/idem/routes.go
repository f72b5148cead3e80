package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

// routeSettings are one route's fields in a --routes file. A field left
// out takes the flag's value.
type routeSettings struct {
	// Require lists the methods that must carry a key on the route, as
	// --require does; [] makes the key optional.
	Require *[]string `json:"require"`
	// TTL is how long the route's keys are remembered, a Go duration.
	TTL string `json:"ttl"`
	// Volatile lists JSON Pointers to members left out of the fingerprint.
	Volatile []string `json:"volatile"`
	// ReleaseStatus and UnknownStatus are lists as --release-status and
	// --unknown-status read them; "" lists nothing.
	ReleaseStatus *string `json:"release_status"`
	UnknownStatus *string `json:"unknown_status"`
	// StrictCanonical refuses a body that cannot be canonicalized, as
	// --strict-canonical does, or with false hashes its raw bytes.
	StrictCanonical *bool `json:"strict_canonical"`
	// Replay is what of an answer is kept for replays, as --replay says.
	Replay *string `json:"replay"`
	// ReplayHeaders are the fields kept beside a status, as
	// --replay-headers says.
	ReplayHeaders *[]string `json:"replay_headers"`
	// ClaimRate and ClaimBurst give the route buckets of its own, as
	// --claim-rate and --claim-burst say.
	ClaimRate  *float64 `json:"claim_rate"`
	ClaimBurst *int     `json:"claim_burst"`
}

// route is one entry of a --routes file, checked.
type route struct {
	pattern  string
	where    string        // file:line, for messages
	methods  []string      // nil: --require's; empty: no method needs a key
	ttl      time.Duration // 0: --ttl's
	volatile []string
	release  *[]int                 // nil: --release-status's
	unknown  *[]int                 // nil: --unknown-status's
	strict   *bool                  // nil: --strict-canonical's
	replay   *idemhttp.ReplayPolicy // nil: --replay's
	kept     *[]string              // nil: --replay-headers'
	rate     *float64               // nil: --claim-rate's
	burst    *int                   // nil: --claim-burst's
	h        http.Handler
}

// ServeHTTP serves the requests the route matches, with its own
// middleware.
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.h.ServeHTTP(w, r) }

// routeTable is a --routes file: its routes, in a ServeMux that matches
// requests to them by its rules.
type routeTable struct {
	mux    *http.ServeMux
	routes []*route
}

// readRoutes reads and checks a --routes file: a JSON object that maps
// each ServeMux pattern to its settings. Every error names the file and
// the line of the route. minTTL is the shortest TTL the store accepts.
func readRoutes(file string, minTTL time.Duration) (*routeTable, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	at := func(off int64) string {
		return fmt.Sprintf("%s:%d", file, 1+bytes.Count(data[:min(int(off), len(data))], []byte("\n")))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%s: want a JSON object that maps route patterns to their settings", at(dec.InputOffset()))
	}
	t := &routeTable{mux: http.NewServeMux()}
	for dec.More() {
		tok, err := dec.Token()
		// The key has been read: the line where it ends is the route's.
		where := at(dec.InputOffset())
		if err != nil {
			return nil, fmt.Errorf("%s: %v", where, err)
		}
		pattern, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("%s: want a route pattern, found %v", where, tok)
		}
		var s routeSettings
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("%s: route %q: %v", where, pattern, err)
		}
		rt, err := newRoute(pattern, where, s, minTTL)
		if err == nil {
			err = t.handle(rt)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: route %q: %w", where, pattern, err)
		}
		t.routes = append(t.routes, rt)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%s: %v", at(dec.InputOffset()), err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%s: data after the routes' object", at(dec.InputOffset()))
	}
	return t, nil
}

// claimRateHelp is --claim-rate's help.
const claimRateHelp = "new idempotency keys a second one tenant may claim: over it a new key gets 429 rate_limited with Retry-After " +
	"and nothing runs, while a retry of a key that exists always gets its answer; a route's claim_rate gives it buckets of its own. " +
	"The limit is this process's: N proxies on one --store allow N times it (default 0: no limit)"

// defaultMinFreeDisk is --min-free-disk's default: room for the flushes
// and compactions that follow the last claims let in.
const defaultMinFreeDisk = 64 << 20

// checkLimits checks a claim rate and burst, named by the flags or the
// route members they came from.
func checkLimits(o idem.Limits, rate, burst string) error {
	switch {
	case o.ClaimRate < 0 || math.IsNaN(o.ClaimRate) || math.IsInf(o.ClaimRate, 0):
		return fmt.Errorf("%s %v must be a positive number of keys a second, or 0 for no limit", rate, o.ClaimRate)
	case o.ClaimBurst < 0:
		return fmt.Errorf("%s %d must not be negative", burst, o.ClaimBurst)
	}
	return nil
}

// replayHelp is --replay's help.
const replayHelp = "what of an upstream answer is kept for replays: all (the whole answer, replayed verbatim), " +
	"public (only the status of an answer whose Cache-Control says no-store or private) or status (only the status, " +
	"for answers that hold one-time secrets); a retry of an answer kept as a status gets 410 response_body_omitted with it"

// parseReplay reads a --replay value.
func parseReplay(s string) (idemhttp.ReplayPolicy, error) {
	switch s {
	case "all":
		return idemhttp.ReplayAll, nil
	case "public":
		return idemhttp.ReplayPublic, nil
	case "status":
		return idemhttp.ReplayStatus, nil
	}
	return 0, fmt.Errorf("%q: want all, public or status", s)
}

// newRoute checks one route's settings.
func newRoute(pattern, where string, s routeSettings, minTTL time.Duration) (*route, error) {
	rt := &route{pattern: pattern, where: where, volatile: s.Volatile, strict: s.StrictCanonical}
	if len(pattern) > idem.MaxEndpointBytes {
		return nil, fmt.Errorf("the pattern is %d bytes, more than %d: it names the endpoint keys are stored under", len(pattern), idem.MaxEndpointBytes)
	}
	if s.Require != nil {
		rt.methods = []string{}
		for _, m := range *s.Require {
			if m = strings.ToUpper(strings.TrimSpace(m)); m == "" {
				return nil, errors.New("require: a method is empty")
			}
			rt.methods = append(rt.methods, m)
		}
	}
	if s.Replay != nil {
		p, err := parseReplay(*s.Replay)
		if err != nil {
			return nil, fmt.Errorf("replay: %v", err)
		}
		rt.replay = &p
	}
	rt.rate, rt.burst, rt.kept = s.ClaimRate, s.ClaimBurst, s.ReplayHeaders
	var o idem.Limits
	if s.ClaimRate != nil {
		o.ClaimRate = *s.ClaimRate
	}
	if s.ClaimBurst != nil {
		o.ClaimBurst = *s.ClaimBurst
	}
	if err := checkLimits(o, "claim_rate", "claim_burst"); err != nil {
		return nil, err
	}
	if s.TTL != "" {
		d, err := time.ParseDuration(s.TTL)
		switch {
		case err != nil:
			return nil, fmt.Errorf("ttl: %q is not a duration (48h, 90m)", s.TTL)
		case d < minTTL:
			return nil, fmt.Errorf("ttl %s must be at least %d leases (%s)", d, idem.MinTTLLeases, minTTL)
		}
		rt.ttl = d
	}
	if _, err := idem.Canonicalize([]byte("{}"), idem.CanonicalOptions{Volatile: s.Volatile}); err != nil {
		return nil, fmt.Errorf("volatile: %v", err)
	}
	for _, l := range []struct {
		name string
		in   *string
		out  **[]int
	}{{"release_status", s.ReleaseStatus, &rt.release}, {"unknown_status", s.UnknownStatus, &rt.unknown}} {
		if l.in == nil {
			continue
		}
		st, err := parseStatuses(*l.in)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", l.name, err)
		}
		*l.out = &st
	}
	return rt, nil
}

// handle registers rt, turning ServeMux's panic over a malformed or
// conflicting pattern into an error.
func (t *routeTable) handle(rt *route) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	t.mux.Handle(rt.pattern, rt)
	return nil
}

// ttls are the routes' own TTLs by endpoint, which is the pattern.
func (t *routeTable) ttls() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, rt := range t.routes {
		if rt.ttl > 0 {
			out[rt.pattern] = rt.ttl
		}
	}
	return out
}

// build gives each route its middleware, base with the route's settings
// over it, in front of next, and base.Store behind limits with the
// route's own: each route's buckets are its own. base.Endpoint is
// replaced: a route's keys are stored under its pattern.
func (t *routeTable) build(base idemhttp.Options, limits idem.Limits, next http.Handler) error {
	for _, rt := range t.routes {
		o := base
		l := limits
		if rt.rate != nil {
			l.ClaimRate = *rt.rate
		}
		if rt.burst != nil {
			l.ClaimBurst = *rt.burst
		}
		var err error
		if o.Store, err = idem.Limit(base.Store, l); err != nil {
			return fmt.Errorf("%s: route %q: %w", rt.where, rt.pattern, err)
		}
		pattern := rt.pattern
		o.Endpoint = func(*http.Request) string { return pattern }
		o.Canonical.Volatile = rt.volatile
		if len(rt.methods) > 0 {
			o.Methods = rt.methods
		}
		if rt.release != nil {
			o.Outcomes.Release = *rt.release
		}
		if rt.unknown != nil {
			o.Outcomes.Unknown = *rt.unknown
		}
		if rt.replay != nil {
			o.Replay = *rt.replay
		}
		if rt.kept != nil {
			o.StatusHeaders = *rt.kept
		}
		if rt.strict != nil {
			o.RawFallback = !*rt.strict
		}
		mw, err := idemhttp.New(o)
		if err != nil {
			return fmt.Errorf("%s: route %q: %w", rt.where, rt.pattern, err)
		}
		rt.h = mw(next)
		if rt.methods != nil && len(rt.methods) == 0 {
			// No method needs a key: a request without one passes
			// straight through, and one that carries a key is protected.
			protected := rt.h
			rt.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, keyed := r.Header[idem.HeaderKey]; !keyed {
					next.ServeHTTP(w, r)
					return
				}
				protected.ServeHTTP(w, r)
			})
		}
	}
	return nil
}

// handler sends each request to the route ServeMux matches it with, and
// one that matches none to fallback. It only matches: it never answers
// with ServeMux's redirects or its 404 and 405, since every path belongs
// to the upstream. A path is matched as ServeMux cleans it (/a//b/../c is
// /a/c), and forwarded as it came.
func (t *routeTable) handler(fallback http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, _ := t.mux.Handler(cleanRequest(r)); h != nil {
			if rt, ok := h.(*route); ok {
				rt.ServeHTTP(w, r)
				return
			}
		}
		fallback.ServeHTTP(w, r)
	})
}

// cleanRequest returns r, or a shallow copy whose path is clean as
// ServeMux makes it before matching, so that the match is a route and not
// a redirect to the clean path.
func cleanRequest(r *http.Request) *http.Request {
	p := r.URL.EscapedPath()
	if r.Method == http.MethodConnect {
		return r
	}
	c := p
	if c == "" || c[0] != '/' {
		c = "/" + c
	}
	c2 := path.Clean(c)
	if strings.HasSuffix(c, "/") && c2 != "/" {
		c2 += "/"
	}
	if c2 == p {
		return r
	}
	u := *r.URL
	u.RawPath = c2
	u.Path, _ = url.PathUnescape(c2)
	r2 := r.WithContext(r.Context())
	r2.URL = &u
	return r2
}
