package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/idemhttp"
)

func problem(t *testing.T, resp *http.Response, body string) idemhttp.Problem {
	t.Helper()
	assert.Equal(t, idemhttp.ProblemType, resp.Header.Get("Content-Type"))
	var p idemhttp.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	assert.Equal(t, resp.StatusCode, p.Status)
	return p
}
