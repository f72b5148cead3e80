package idem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkv/idem"
)

func TestResponseCheck(t *testing.T) {
	many := http.Header{}
	for range idem.MaxResponseHeaders + 1 {
		many.Add("Set-Cookie", "a=b")
	}
	big := http.Header{"X-Big": {strings.Repeat("x", idem.MaxResponseHeaderBytes)}}
	// The largest header that fits: one value of exactly the byte bound.
	fits := http.Header{"X-Big": {strings.Repeat("x", idem.MaxResponseHeaderBytes-len("X-Big")-4)}}
	for _, c := range []struct {
		name string
		resp idem.Response
		ok   bool
	}{
		{"plain", idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}}, true},
		{"no header", idem.Response{Status: 100}, true},
		{"at the byte bound", idem.Response{Status: 200, Header: fits}, true},
		{"status low", idem.Response{Status: 99}, false},
		{"status high", idem.Response{Status: 1000}, false},
		{"too many values", idem.Response{Status: 200, Header: many}, false},
		{"too many bytes", idem.Response{Status: 200, Header: big}, false},
	} {
		err := c.resp.Check()
		if c.ok {
			assert.NoError(t, err, c.name)
		} else {
			assert.ErrorIs(t, err, idem.ErrInvalidResponse, c.name)
		}
	}
}
