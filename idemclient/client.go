package idemclient

import (
	"bytes"
	"context"
	"net/http"
)

// Client is an http.Client whose transport is a Transport, with helpers
// that name the operation each request belongs to. Most callers need only
// Post. It is safe for concurrent use.
type Client struct {
	hc *http.Client
}

// NewClient returns a Client whose transport is NewTransport(opts).
func NewClient(opts *Options) (*Client, error) {
	t, err := NewTransport(opts)
	if err != nil {
		return nil, err
	}
	return &Client{hc: &http.Client{Transport: t}}, nil
}

// HTTPClient returns the underlying http.Client, for code that wants one.
// Setting its Timeout bounds a whole call, retries and waits included.
func (c *Client) HTTPClient() *http.Client { return c.hc }

// Do sends req as part of operation op (see WithOperation; "" names none,
// and the call gets a key of its own). Errors are those of http.Client.Do:
// a *RetryError arrives wrapped in a *url.Error, and errors.As finds it.
func (c *Client) Do(op string, req *http.Request) (*http.Response, error) {
	if op != "" {
		req = req.WithContext(WithOperation(req.Context(), op))
	}
	return c.hc.Do(req)
}

// Post sends body to url with a POST as part of operation op. The body is
// held in memory, so every retry can send it again.
func (c *Client) Post(ctx context.Context, op, url, contentType string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.Do(op, req)
}
