package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHelpLinksExist: every documentation link a --help text gives names
// a file of the repository and, when it has one, a heading or an anchor
// in it, so that moving a section breaks this test instead of the link.
func TestHelpLinksExist(t *testing.T) {
	link := regexp.MustCompile(regexp.QuoteMeta(docsURL("")) + `([\w./-]+)(?:#([\w-]+))?`)
	seen := 0
	for name, cmd := range commands {
		var help strings.Builder
		cmd.run([]string{"--help"}, strings.NewReader(""), io.Discard, &help)
		links := link.FindAllStringSubmatch(help.String(), -1)
		assert.NotEmpty(t, links, "%s --help points at no documentation", name)
		for _, m := range links {
			seen++
			b, err := os.ReadFile(filepath.Join("..", "..", m[1]))
			require.NoError(t, err, "%s --help: %s", name, m[0])
			if m[2] != "" {
				assert.Contains(t, anchorsOf(string(b)), m[2], "%s --help: %s", name, m[0])
			}
		}
	}
	assert.NotZero(t, seen)
}

// anchorsOf returns the anchors of a Markdown document as GitHub makes
// them from its headings, and its explicit <a id> anchors.
func anchorsOf(doc string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`<a id="([^"]+)"></a>`).FindAllStringSubmatch(doc, -1) {
		out = append(out, m[1])
	}
	fence := false
	for line := range strings.SplitSeq(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && !fence && strings.HasPrefix(line, "#") {
			h = regexp.MustCompile(`[^\w\- ]`).ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), "")
			out = append(out, strings.ReplaceAll(h, " ", "-"))
		}
	}
	return out
}
