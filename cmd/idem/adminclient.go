package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
)

// adminTimeout bounds one call to the admin listener that is not a
// listing, which streams for as long as the store has records.
const adminTimeout = time.Minute

// adminClient is a toolStore over a running server's operator routes
// (adminops.go). Its errors match the store's (idem.ErrNotFound,
// idem.ErrCompleted, a *idem.KeyError for ErrInProgress), so the tools
// answer as they do with the store open themselves.
type adminClient struct {
	base  string // the URL without a trailing slash
	token string
	hc    *http.Client
}

func newAdminClient(base, token string) *adminClient {
	return &adminClient{base: strings.TrimRight(base, "/"), token: token, hc: &http.Client{}}
}

// Close lets go of idle connections.
func (c *adminClient) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// do sends a request with the token and returns a response with a 2xx
// status, or the error its problem document stands for.
func (c *adminClient) do(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the admin listener at %s: %w", c.base, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer discard(resp.Body)
	var p idemhttp.Problem
	if resp.Header.Get("Content-Type") != idemhttp.ProblemType || json.NewDecoder(resp.Body).Decode(&p) != nil {
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("the admin listener at %s serves no operator routes: start idem proxy with an admin token (--admin-token-file or %s)", c.base, adminTokenEnv)
		}
		return nil, fmt.Errorf("the admin listener at %s answered %s", c.base, resp.Status)
	}
	switch p.Code {
	case codeNotFound:
		return nil, idem.ErrNotFound
	case codeCompleted:
		return nil, idem.ErrCompleted
	case idem.CodeInProgress:
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return nil, &idem.KeyError{Err: idem.ErrInProgress, State: idem.StateInProgress, RetryAfter: time.Duration(secs) * time.Second}
	case codeUnauthorized:
		return nil, fmt.Errorf("the admin listener at %s refused the admin token", c.base)
	}
	return nil, fmt.Errorf("the admin listener at %s: %s (%s)", c.base, p.Detail, p.Code)
}

// call sends in as JSON and decodes the answer into out.
func (c *adminClient) call(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer discard(resp.Body)
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("the admin listener at %s: reading its answer: %w", c.base, err)
	}
	return nil
}

func (c *adminClient) Get(ctx context.Context, s idem.Scope) (*idem.Record, error) {
	var w wireRecord
	if err := c.call(ctx, "POST", "/v1/admin/record", scopeRequest{s.Tenant, s.Endpoint, s.Key}, &w); err != nil {
		return nil, err
	}
	return w.record()
}

func (c *adminClient) Metrics(ctx context.Context) (idem.Metrics, error) {
	var m idem.Metrics
	err := c.call(ctx, "GET", "/v1/admin/metrics", nil, &m)
	return m, err
}

func (c *adminClient) Resolve(ctx context.Context, s idem.Scope, res resolution) (*idem.Record, error) {
	req := resolveRequest{scopeRequest: scopeRequest{s.Tenant, s.Endpoint, s.Key}, As: res.As, Reason: res.Reason,
		Status: res.Response.Status, Header: res.Response.Header, Body: res.Response.Body}
	var out resolveResult
	if err := c.call(ctx, "POST", "/v1/admin/resolve", req, &out); err != nil {
		return nil, err
	}
	st, err := idem.ParseState(out.From)
	if err != nil {
		return nil, fmt.Errorf("the admin listener at %s: reading its answer: %w", c.base, err)
	}
	return &idem.Record{Scope: s, State: st, Attempts: out.Attempts}, nil
}

// Records streams the listing; breaking out of the loop closes it.
func (c *adminClient) Records(ctx context.Context, f idem.Filter) iter.Seq2[*idem.Record, error] {
	return func(yield func(*idem.Record, error) bool) {
		q := url.Values{}
		for k, v := range map[string]string{"tenant": f.Tenant, "endpoint": f.Endpoint} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if f.State != 0 {
			q.Set("state", f.State.String())
		}
		if !f.CreatedBefore.IsZero() {
			q.Set("created_before", f.CreatedBefore.UTC().Format(time.RFC3339Nano))
		}
		if f.Expired {
			q.Set("expired", "true")
		}
		resp, err := c.do(ctx, "GET", "/v1/admin/records?"+q.Encode(), nil)
		if err != nil {
			yield(nil, err)
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, maxAdminBody)
		for sc.Scan() {
			var line recordLine
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				yield(nil, fmt.Errorf("the admin listener at %s: reading its listing: %w", c.base, err))
				return
			}
			if line.Error != "" {
				yield(nil, fmt.Errorf("the admin listener at %s: %s", c.base, line.Error))
				return
			}
			rec, err := line.record()
			if !yield(rec, err) || err != nil {
				return
			}
		}
		if err := sc.Err(); err != nil {
			yield(nil, fmt.Errorf("the admin listener at %s: reading its listing: %w", c.base, err))
		}
	}
}
