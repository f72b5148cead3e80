package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/idemkv/idem/idemhttp"
)

// The proxy's check before a replay: with --auth-check-url, a retry's
// credentials go to the upstream before its stored answer is sent again,
// so that a revoked token stops getting answers at once rather than when
// its keys expire.

const authCheckHelp = "`URL` asked before each replay, with the retry's Authorization, Cookie and tenant header " +
	"and X-Original-Method and X-Original-URI: a 2xx answer lets the stored answer go, 401 or 403 refuses it " +
	"with 403 replay_forbidden, anything else (or no answer within --upstream-timeout) with 503 replay_check_failed " +
	"(default none: a replay goes to any caller whose tenant matches, even one whose credentials were revoked since)"

// authCheckUserAgent names the checks in the upstream's logs.
const authCheckUserAgent = "idem-proxy-auth-check"

// authChecker asks the upstream whether a retry's credentials still hold.
type authChecker struct {
	url     *url.URL
	headers []string // the request's fields forwarded: the credentials
	client  *http.Client
	timeout time.Duration
}

// newAuthChecker returns the checker for --auth-check-url s, or nil when
// s is empty. tenantHeader, when set, is forwarded too, with its
// signature.
func newAuthChecker(s, tenantHeader string, timeout time.Duration) (*authChecker, error) {
	if s == "" {
		return nil, nil
	}
	u, err := parseAskURL(s)
	if err != nil {
		return nil, fmt.Errorf("--auth-check-url %v", err)
	}
	c := &authChecker{url: u, headers: []string{"Authorization", "Cookie"}, timeout: timeout, client: askClient()}
	if tenantHeader != "" {
		c.headers = append(c.headers, tenantHeader, tenantHeader+signatureSuffix)
	}
	return c, nil
}

// authorizeFunc returns c.authorize for idemhttp.Options, or nil without
// a checker.
func (c *authChecker) authorizeFunc() func(*http.Request) error {
	if c == nil {
		return nil
	}
	return c.authorize
}

// authorize is idemhttp.Options.AuthorizeReplay. Its errors never hold
// the URL, whose query may hold a secret.
func (c *authChecker) authorize(r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url.String(), nil)
	if err != nil {
		return fmt.Errorf("auth check: %w", err)
	}
	for _, name := range c.headers {
		if vs := r.Header.Values(name); len(vs) > 0 {
			req.Header[http.CanonicalHeaderKey(name)] = vs
		}
	}
	req.Header.Set("User-Agent", authCheckUserAgent)
	req.Header.Set("X-Original-Method", r.Method)
	req.Header.Set("X-Original-URI", r.URL.RequestURI())
	resp, err := c.client.Do(req)
	if err != nil {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return fmt.Errorf("auth check: %w", err)
	}
	discard(resp.Body)
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("auth check answered %s: %w", resp.Status, idemhttp.ErrReplayForbidden)
	}
	return fmt.Errorf("auth check answered %s, neither 2xx nor 401 or 403", resp.Status)
}
