package canon

import (
	"errors"
	"strings"
)

// CheckPointer reports whether p is an RFC 6901 JSON Pointer that Options
// can use. The empty pointer, which names the whole document, is refused:
// dropping the whole body would make every request look alike.
func CheckPointer(p string) error {
	return eachToken(p, func(string) {})
}

// eachToken calls fn with each decoded token of p, without allocating
// unless a token has to be unescaped.
func eachToken(p string, fn func(string)) error {
	if p == "" {
		return errors.New("canon: the empty pointer names the whole document")
	}
	if p[0] != '/' {
		return errors.New(`canon: a pointer must start with "/"`)
	}
	rest, more := p[1:], true
	for more {
		var t string
		t, rest, more = strings.Cut(rest, "/")
		if strings.Contains(t, "~") {
			for j := 0; j < len(t); j++ {
				if t[j] == '~' && (j+1 == len(t) || t[j+1] != '0' && t[j+1] != '1') {
					return errors.New(`canon: "~" must be followed by "0" or "1"`)
				}
			}
			// "~1" first, so that "~01" becomes "~1" and not "/".
			t = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
		}
		fn(t)
	}
	return nil
}

// matcher is the volatile pointers folded into a tree: node 0 is the
// document root, every other node one reference token under its parent.
// While parsing, each container carries the set of nodes its path reaches;
// a child whose token reaches a leaf is dropped.
type matcher struct {
	nodes []vnode
}

type vnode struct {
	parent int32
	tok    string
	wild   bool // the token was "*"
	leaf   bool // some pointer ends here
}

func (m *matcher) compile(ptrs []string) error {
	m.nodes = m.nodes[:0]
	if len(ptrs) == 0 {
		return nil
	}
	m.nodes = append(m.nodes, vnode{parent: -1})
	for _, p := range ptrs {
		at := int32(0)
		if err := eachToken(p, func(t string) { at = m.child(at, t) }); err != nil {
			return err
		}
		m.nodes[at].leaf = true
	}
	return nil
}

func (m *matcher) child(parent int32, tok string) int32 {
	wild := tok == "*"
	for i := range m.nodes {
		n := &m.nodes[i]
		if n.parent == parent && n.wild == wild && (wild || n.tok == tok) {
			return int32(i)
		}
	}
	m.nodes = append(m.nodes, vnode{parent: parent, tok: tok, wild: wild})
	return int32(len(m.nodes) - 1)
}

// step appends to *sets the nodes that the child tok of the container with
// set (*sets)[off:off+n] reaches, and reports whether one of them is a leaf.
func (m *matcher) step(sets *[]int32, off, n int, tok []byte) bool {
	leaf := false
	for j := off; j < off+n; j++ {
		at := (*sets)[j]
		for i := range m.nodes {
			c := &m.nodes[i]
			if c.parent != at || !c.wild && c.tok != string(tok) {
				continue
			}
			if c.leaf {
				leaf = true
			}
			*sets = append(*sets, int32(i))
		}
	}
	return leaf
}
