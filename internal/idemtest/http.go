package idemtest

import (
	"context"
	"io"
	"net/http"
	"strings"
)

// Send makes one request with c and reads the answer whole. header holds
// name, value pairs, each added, so a name given twice goes on two field
// lines; a non-empty body is sent as JSON.
func Send(ctx context.Context, c *http.Client, method, url, body string, header ...string) (status int, h http.Header, b []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}
