package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/pgtest"
)

// binary is the idem command built once for the package's tests, which
// run it as a real process: exit codes and stream contents are the
// interface being tested.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-cmd-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idem")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building idem: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// pgtest stops the PostgreSQL it may have started for the tests that
	// keep records there.
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

func runIdem(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{stdout.String(), stderr.String(), code}
}

func TestDispatch(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		code       int
		wantStdout string
		wantStderr string
	}{
		{"no arguments", nil, 2, "", "usage: idem <command>"},
		{"unknown command", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"help", []string{"help"}, 0, "fingerprint", ""},
		{"--help", []string{"--help"}, 0, "canon", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, "", c.args...)
			assert.Equal(t, c.code, r.code)
			assert.Contains(t, r.stdout, c.wantStdout)
			assert.Contains(t, r.stderr, c.wantStderr)
		})
	}
}

func TestCanon(t *testing.T) {
	file := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"b": 9007199254740993, "a": 4.2e3}`), 0o644))
	cases := []struct {
		name  string
		stdin string
		args  []string
		out   string
	}{
		{"stdin", `{ "b" : [1, 2.50], "a" : null }`, nil, `{"a":null,"b":[1,2.5]}`},
		{"stdin as -", `[1e21]`, []string{"-"}, `[1e+21]`},
		{"file", "", []string{file}, `{"a":4200,"b":9007199254740993}`},
		{"jcs profile", "", []string{"--profile", "jcs", file}, `{"a":4200,"b":9007199254740992}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, c.stdin, append([]string{"canon"}, c.args...)...)
			require.Equal(t, 0, r.code, r.stderr)
			assert.Equal(t, c.out, r.stdout) // exactly: no trailing newline
			assert.Empty(t, r.stderr)
		})
	}
}

func TestCanonFailures(t *testing.T) {
	cases := []struct {
		name   string
		stdin  string
		args   []string
		code   int
		stderr string
	}{
		{"duplicate member", "{\"a\": 1,\n  \"a\": 2}", nil, 1, "<stdin>:2:3: member \"a\" appears more than once (duplicate_member at byte 11)"},
		{"invalid UTF-8", "\"\xff\"", nil, 1, "invalid_utf8 at byte 1"},
		{"empty input", "", nil, 1, "syntax at byte 0"},
		{"missing file", "", []string{"/nonexistent/body.json"}, 1, "no such file"},
		{"unknown profile", "{}", []string{"--profile", "double"}, 2, `unknown canonicalization profile "double"`},
		{"unknown flag", "{}", []string{"--pretty"}, 2, "flag provided but not defined"},
		{"two files", "{}", []string{"a.json", "b.json"}, 2, "at most one FILE"},
		{"help", "", []string{"--help"}, 0, "usage: idem canon"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runIdem(t, c.stdin, append([]string{"canon"}, c.args...)...)
			assert.Equal(t, c.code, r.code)
			assert.Empty(t, r.stdout)
			assert.Contains(t, r.stderr, c.stderr)
		})
	}
}
