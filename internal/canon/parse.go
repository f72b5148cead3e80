package canon

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
)

// state is one canonicalization in progress. It is pooled: every slice is
// reused across calls and reset by release.
type state struct {
	src      []byte
	out      []byte
	jcs      bool
	maxDepth int

	// stack holds the open containers, innermost last; its length is the
	// current depth and never exceeds maxDepth.
	stack []frame
	// members holds the names read so far in every open object; an
	// object's own start at its frame's base.
	members []member
	// keys holds the decoded names that contained escapes (names without
	// escapes are read straight from src). Truncated when an object closes.
	keys []byte
	// scratch is where an unsorted object is reassembled, and where
	// number digits are gathered.
	scratch []byte
	vol     matcher
	// sets is a stack of matcher node sets (see matcher), one region per
	// open container plus one for the value being parsed.
	sets []int32
}

type frame struct {
	obj      bool
	unsorted bool // some member came out of order: sort at close
	drop     bool // the current member or element is volatile
	start    int  // out offset of the opening bracket
	base     int  // first index of this object's members
	keyBase  int  // len(keys) at open
	emitted  int  // members or elements written so far (commas)
	index    int  // next array index, for pointer matching
	cut      int  // out length before the current child, comma included
	setOff   int  // this container's matcher set: sets[setOff:setOff+setLen]
	setLen   int
	pendLen  int // the current child's set follows this container's
}

// member is one object member. Its canonical bytes, without the comma, are
// out[start:end]. Offsets into the input fit in 32 bits because Append caps
// the input there; keeping the struct small is what makes sorting cheap.
type member struct {
	// prefix is the name's first 8 bytes, big-endian and zero-padded: it
	// orders most pairs of names without looking at them.
	prefix  uint64
	keyOff  int32 // in src, or in keys when esc
	keyLen  int32
	src     int32 // offset of the name's opening quote, for errors
	esc     bool
	dropped bool
	start   int
	end     int
}

func (s *state) key(m *member) []byte {
	if m.esc {
		return s.keys[m.keyOff : m.keyOff+m.keyLen]
	}
	return s.src[m.keyOff : m.keyOff+m.keyLen]
}

func prefixOf(k []byte) uint64 {
	if len(k) >= 8 {
		return binary.BigEndian.Uint64(k)
	}
	var b [8]byte
	copy(b[:], k)
	return binary.BigEndian.Uint64(b[:])
}

// compare orders two members by name (see compareUTF16). When the prefixes
// first differ in an ASCII byte (the zero padding counts as one: a name
// that ends there is a prefix of the other) byte order is the answer.
func (s *state) compare(a, b *member) int {
	if x := a.prefix ^ b.prefix; x != 0 {
		shift := 56 - bits.LeadingZeros64(x)&^7
		ca, cb := byte(a.prefix>>shift), byte(b.prefix>>shift)
		if ca < utf8.RuneSelf && cb < utf8.RuneSelf {
			return cmpByte(ca, cb)
		}
	}
	return compareUTF16(s.key(a), s.key(b))
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *state) ws(i int) int {
	for i < len(s.src) && isSpace(s.src[i]) {
		i++
	}
	return i
}

func (s *state) run() error {
	src := s.src
	if len(src) >= 3 && src[0] == 0xEF && src[1] == 0xBB && src[2] == 0xBF {
		return fail(ErrBOM, 0, "input starts with a byte order mark")
	}
	s.sets = s.sets[:0]
	if len(s.vol.nodes) > 0 {
		s.sets = append(s.sets, 0) // the root value is matched from the root node
	}
	i := s.ws(0)
	var err error
value:
	if i >= len(src) {
		return fail(ErrSyntax, i, "unexpected end of input, expected a value")
	}
	switch c := src[i]; c {
	case '{':
		if err = s.push(true, i); err != nil {
			return err
		}
		i = s.ws(i + 1)
		if i < len(src) && src[i] == '}' {
			i++
			s.closeObject()
			goto done
		}
		if i, err = s.member(i); err != nil {
			return err
		}
		goto value
	case '[':
		if err = s.push(false, i); err != nil {
			return err
		}
		i = s.ws(i + 1)
		if i < len(src) && src[i] == ']' {
			i++
			s.closeArray()
			goto done
		}
		s.element()
		goto value
	case '"':
		i, _, err = s.str(i)
	case 't':
		i, err = s.literal(i, "true")
	case 'f':
		i, err = s.literal(i, "false")
	case 'n':
		i, err = s.literal(i, "null")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '+', '.', 'N', 'I':
		i, err = s.number(i)
	default:
		return s.unexpected(i, "a value")
	}
	if err != nil {
		return err
	}
done:
	for {
		if len(s.stack) == 0 {
			if i = s.ws(i); i < len(src) {
				return fail(ErrTrailingData, i, "data after the end of the document")
			}
			return nil
		}
		top := &s.stack[len(s.stack)-1]
		s.endChild(top)
		if i = s.ws(i); i >= len(src) {
			return fail(ErrSyntax, i, "unexpected end of input inside %s", kind(top.obj))
		}
		switch c := src[i]; {
		case c == ',':
			i = s.ws(i + 1)
			if top.obj {
				if i, err = s.member(i); err != nil {
					return err
				}
			} else {
				s.element()
			}
			goto value
		case c == '}' && top.obj:
			i++
			if err = s.finishObject(top); err != nil {
				return err
			}
			s.closeObject()
		case c == ']' && !top.obj:
			i++
			s.closeArray()
		default:
			if top.obj {
				return s.unexpected(i, `"," or "}"`)
			}
			return s.unexpected(i, `"," or "]"`)
		}
	}
}

func kind(obj bool) string {
	if obj {
		return "an object"
	}
	return "an array"
}

// unexpected reports a byte that cannot start what the grammar needs,
// naming bad UTF-8 as such since that is the likelier mistake.
func (s *state) unexpected(i int, want string) error {
	if c := s.src[i]; c >= utf8.RuneSelf {
		if r, n := utf8.DecodeRune(s.src[i:]); r == utf8.RuneError && n <= 1 {
			return fail(ErrInvalidUTF8, i, "byte 0x%02x is not UTF-8", c)
		}
	}
	return fail(ErrSyntax, i, "unexpected %s, expected %s", strconv.QuoteRune(rune(s.src[i])), want)
}

func (s *state) literal(i int, lit string) (int, error) {
	if len(s.src)-i < len(lit) || string(s.src[i:i+len(lit)]) != lit {
		return i, fail(ErrSyntax, i, "invalid literal, expected %s", lit)
	}
	s.out = append(s.out, lit...)
	return i + len(lit), nil
}

func (s *state) push(obj bool, i int) error {
	if len(s.stack) >= s.maxDepth {
		return fail(ErrDepthExceeded, i, "nesting deeper than %d", s.maxDepth)
	}
	f := frame{obj: obj, start: len(s.out), base: len(s.members), keyBase: len(s.keys)}
	if n := len(s.stack); n > 0 {
		p := &s.stack[n-1]
		f.setOff, f.setLen = p.setOff+p.setLen, p.pendLen
	} else {
		f.setLen = len(s.sets)
	}
	s.stack = append(s.stack, f)
	if obj {
		s.out = append(s.out, '{')
	} else {
		s.out = append(s.out, '[')
	}
	return nil
}

// member reads a member name and its colon, leaving i at the value.
func (s *state) member(i int) (int, error) {
	src := s.src
	f := &s.stack[len(s.stack)-1]
	if i >= len(src) || src[i] != '"' {
		if i >= len(src) {
			return i, fail(ErrSyntax, i, "unexpected end of input, expected a member name")
		}
		return i, s.unexpected(i, "a member name")
	}
	f.cut = len(s.out)
	if f.emitted > 0 {
		s.out = append(s.out, ',')
	}
	m := member{src: int32(i), start: len(s.out)}
	end, esc, err := s.str(i)
	if err != nil {
		return end, err
	}
	if esc {
		m.esc = true
		m.keyOff = int32(len(s.keys))
		s.keys = unescape(s.keys, s.out[m.start+1:len(s.out)-1])
		m.keyLen = int32(len(s.keys)) - m.keyOff
	} else {
		m.keyOff, m.keyLen = int32(i+1), int32(end-i-2)
	}
	k := s.key(&m)
	m.prefix = prefixOf(k)
	if len(s.members) > f.base {
		prev := &s.members[len(s.members)-1]
		switch s.compare(prev, &m) {
		case 0:
			return i, fail(ErrDuplicateMember, i, "member %s appears more than once", quote(k))
		case 1:
			f.unsorted = true
		}
	}
	s.members = append(s.members, m)
	if f.setLen > 0 {
		f.drop = s.step(f, k)
	}
	i = s.ws(end)
	if i >= len(src) || src[i] != ':' {
		if i >= len(src) {
			return i, fail(ErrSyntax, i, "unexpected end of input, expected \":\"")
		}
		return i, s.unexpected(i, `":"`)
	}
	s.out = append(s.out, ':')
	return s.ws(i + 1), nil
}

func (s *state) element() {
	f := &s.stack[len(s.stack)-1]
	f.cut = len(s.out)
	if f.emitted > 0 {
		s.out = append(s.out, ',')
	}
	if f.setLen > 0 {
		var buf [20]byte
		f.drop = s.step(f, strconv.AppendInt(buf[:0], int64(f.index), 10))
	}
	f.index++
}

// step matches the child named tok against the container's pointer set,
// leaving the child's own set after it, and reports whether the child is
// volatile.
func (s *state) step(f *frame, tok []byte) bool {
	s.sets = s.sets[:f.setOff+f.setLen]
	drop := s.vol.step(&s.sets, f.setOff, f.setLen, tok)
	if drop {
		s.sets = s.sets[:f.setOff+f.setLen]
	}
	f.pendLen = len(s.sets) - f.setOff - f.setLen
	return drop
}

// endChild accounts for the member or element that just ended.
func (s *state) endChild(f *frame) {
	if f.drop {
		s.out = s.out[:f.cut]
	} else {
		f.emitted++
	}
	if f.obj {
		m := &s.members[len(s.members)-1]
		m.dropped = f.drop
		m.end = len(s.out)
	}
	f.drop = false
	f.pendLen = 0
}

// finishObject puts an object's members in order, if they did not arrive
// in order, and checks that no name repeats.
func (s *state) finishObject(f *frame) error {
	if !f.unsorted {
		return nil
	}
	ms := s.members[f.base:]
	if len(ms) <= 12 {
		// Objects are mostly small; this beats a generic sort's calls.
		for j := 1; j < len(ms); j++ {
			for k := j; k > 0 && s.compare(&ms[k-1], &ms[k]) > 0; k-- {
				ms[k-1], ms[k] = ms[k], ms[k-1]
			}
		}
	} else {
		slices.SortFunc(ms, func(a, b member) int { return s.compare(&a, &b) })
	}
	for j := 1; j < len(ms); j++ {
		if s.compare(&ms[j-1], &ms[j]) == 0 {
			later := max(ms[j-1].src, ms[j].src)
			return fail(ErrDuplicateMember, int(later), "member %s appears more than once", quote(s.key(&ms[j])))
		}
	}
	buf := s.scratch[:0]
	for j := range ms {
		m := &ms[j]
		if m.dropped {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, s.out[m.start:m.end]...)
	}
	copy(s.out[f.start+1:], buf)
	s.scratch = buf[:0]
	return nil
}

func (s *state) closeObject() {
	f := &s.stack[len(s.stack)-1]
	s.out = append(s.out, '}')
	s.members = s.members[:f.base]
	s.keys = s.keys[:f.keyBase]
	s.pop(f)
}

func (s *state) closeArray() {
	s.out = append(s.out, ']')
	s.pop(&s.stack[len(s.stack)-1])
}

func (s *state) pop(f *frame) {
	s.sets = s.sets[:f.setOff+f.setLen]
	s.stack = s.stack[:len(s.stack)-1]
}
