package prompt

import (
	"bytes"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// chatScan is the state of one scanChat.
type chatScan struct {
	scanner
	// text is the rendering so far. Messages and tools are each rendered
	// into one region of it, in body order; tools are moved first at the end.
	text []byte
	// calls collects one message's tool calls, which render after its
	// content wherever they stand in the message object.
	calls []byte
}

var chatTopFields = []string{"model", "messages", "tools", "stream", "stream_options", "cache_salt", "prompt_cache_key", "bootstrap_room", "priority", "max_completion_tokens", "max_tokens", "max_output_tokens"}

// scanChat is RenderChat's fast path; ok=false means "ask RenderChatStd".
// It renders into buf when cap(buf) >= len(body) (RenderChatTo), else
// into a new array.
func scanChat(body, buf []byte) (Prompt, bool) {
	c := chatScan{scanner: scanner{jsonscan.New(body, maxScanDepth)}}
	if !c.Eat('{') {
		return Prompt{}, false
	}
	var t topFields
	var seen uint32
	msgs, tools := [2]int{-1, -1}, [2]int{-1, -1}
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return Prompt{}, false
		}
		if done {
			break
		}
		handled, ok := c.common(key, &seen, &t)
		if handled {
			if !ok {
				return Prompt{}, false
			}
			continue
		}
		if c.text == nil && (string(key) == "messages" || string(key) == "tools") {
			// The rendering is about as long as the body: the content is
			// most of both. Sizing for it avoids regrowing a large text
			// several times.
			if cap(buf) >= len(body) {
				c.text = buf[:0]
			} else {
				c.text = make([]byte, 0, len(body)+64)
			}
		}
		switch string(key) {
		case "messages":
			if !once(&seen, 1<<4) {
				return Prompt{}, false
			}
			msgs[0] = len(c.text)
			if !c.messages() {
				return Prompt{}, false
			}
			msgs[1] = len(c.text)
		case "tools":
			if !once(&seen, 1<<5) {
				return Prompt{}, false
			}
			tools[0] = len(c.text)
			if !c.tools() {
				return Prompt{}, false
			}
			tools[1] = len(c.text)
		default:
			if !c.unknown(key, 1, chatTopFields...) {
				return Prompt{}, false
			}
		}
	}
	if !c.End() || len(t.model) == 0 || msgs[0] < 0 || msgs[0] == msgs[1] {
		return Prompt{}, false
	}
	text := c.text
	if tools[0] > msgs[0] && tools[1] > tools[0] {
		// Tools came after the messages in the body; they render first.
		// The two regions are adjacent, so rotate them.
		tl := bytes.Clone(text[tools[0]:tools[1]])
		copy(text[msgs[0]+len(tl):], text[msgs[0]:msgs[1]])
		copy(text[msgs[0]:], tl)
	}
	if cap(text) > 2*len(text)+4096 && buf == nil {
		// Mostly images or ignored fields: do not hold a body-sized
		// buffer for a short text (a lent buffer goes back anyway).
		text = bytes.Clone(text)
	}
	return t.prompt(true, text), true
}

// tools renders the tools array: each tool as its compacted JSON, as
// RenderChatStd does with the json.RawMessage.
func (c *chatScan) tools() bool {
	switch c.Peek() {
	case 'n':
		return c.Literal("null")
	case '[':
		c.Next()
	default:
		return false
	}
	for first := true; ; first = false {
		done, ok := c.Element(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		c.Peek()
		start := c.Pos()
		if !c.Skip(2) {
			return false
		}
		c.text = append(c.text, recordSep)
		c.text = append(c.text, "tool"...)
		c.text = append(c.text, unitSep)
		c.text = appendCompactJSON(c.text, c.Since(start))
	}
}

// messages renders the messages array. An empty or null one is an error,
// left to the reference.
func (c *chatScan) messages() bool {
	if !c.Eat('[') {
		return false
	}
	for first := true; ; first = false {
		done, ok := c.Element(first)
		if !ok || (done && first) {
			return false
		}
		if done {
			return true
		}
		if !c.message() {
			return false
		}
	}
}

var messageFields = []string{"role", "name", "content", "tool_calls", "tool_call_id"}

// message renders one message. Its fields may come in any order, so the
// content is rendered into text first and the header (role, name, tool
// call id) is slid in front of it once the object is complete.
func (c *chatScan) message() bool {
	if !c.Eat('{') { // a null message has no role, which is an error
		return false
	}
	mark := len(c.text)
	c.calls = c.calls[:0]
	var role, name, callID []byte
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return false
		}
		if done {
			break
		}
		switch string(key) {
		case "role":
			ok = once(&seen, 1<<0)
			if ok {
				role, ok = c.stringValue()
			}
		case "name":
			ok = once(&seen, 1<<1)
			if ok {
				name, ok = c.stringValue()
			}
		case "tool_call_id":
			ok = once(&seen, 1<<2)
			if ok {
				callID, ok = c.stringValue()
			}
		case "content":
			ok = once(&seen, 1<<3) && c.content()
		case "tool_calls":
			ok = once(&seen, 1<<4) && c.toolCalls()
		default:
			ok = c.unknown(key, 3, messageFields...)
		}
		if !ok {
			return false
		}
	}
	if len(role) == 0 {
		return false
	}
	h := 2 + len(role)
	if len(name) > 0 {
		h += 1 + len(name)
	}
	if len(callID) > 0 {
		h += 1 + len(callID)
	}
	n := len(c.text)
	c.text = append(c.text, make([]byte, h)...)
	copy(c.text[mark+h:], c.text[mark:n])
	w := c.text[mark : mark+h]
	w[0] = recordSep
	i := 1 + copy(w[1:], role)
	if len(name) > 0 {
		w[i] = unitSep
		i += 1 + copy(w[i+1:], name)
	}
	if len(callID) > 0 {
		w[i] = unitSep
		i += 1 + copy(w[i+1:], callID)
	}
	w[i] = unitSep
	c.text = append(c.text, c.calls...)
	return true
}

// content renders a message's content as appendContent does with
// chatContent: a string as itself, null as nothing, an array part by part.
func (c *chatScan) content() bool {
	switch c.Peek() {
	case '"':
		var ok bool
		c.text, ok = c.AppendString(c.text)
		return ok
	case 'n':
		return c.Literal("null")
	case '[':
		c.Next()
	default:
		return false
	}
	for first := true; ; first = false {
		done, ok := c.Element(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		if !c.part() {
			return false
		}
	}
}

var partFields = []string{"type", "text"}

// part renders one content part: a text part as its text, any other as its
// type and the digest of its JSON. The type may follow the text, so the
// text is appended first and dropped if the part turns out not to be text.
func (c *chatScan) part() bool {
	c.Peek()
	start := c.Pos()
	switch c.Peek() {
	case 'n':
		// encoding/json decodes null into an empty part: no type, so a
		// digest of "null".
		if !c.Literal("null") {
			return false
		}
		return c.partDigest(nil, start)
	case '{':
		c.Next()
	default:
		return false
	}
	mark := len(c.text)
	var typ []byte
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return false
		}
		if done {
			break
		}
		switch string(key) {
		case "type":
			ok = once(&seen, 1<<0)
			if ok {
				typ, ok = c.stringValue()
			}
		case "text":
			ok = once(&seen, 1<<1)
			if ok {
				switch c.Peek() {
				case 'n':
					ok = c.Literal("null")
				case '"':
					c.text, ok = c.AppendString(c.text)
				default:
					ok = false
				}
			}
		default:
			ok = c.unknown(key, 5, partFields...)
		}
		if !ok {
			return false
		}
	}
	if isText(&chatContent, typ) {
		return true
	}
	c.text = c.text[:mark]
	return c.partDigest(typ, start)
}

func (c *chatScan) partDigest(typ []byte, start int) bool {
	c.text = appendPartDigest(c.text, typ, c.Since(start))
	return true
}

var callFields = []string{"id", "type", "function"}

// toolCalls renders a message's tool calls into c.calls.
func (c *chatScan) toolCalls() bool {
	switch c.Peek() {
	case 'n':
		return c.Literal("null")
	case '[':
		c.Next()
	default:
		return false
	}
	for first := true; ; first = false {
		done, ok := c.Element(first)
		if !ok {
			return false
		}
		if done {
			return true
		}
		if !c.toolCall() {
			return false
		}
	}
}

func (c *chatScan) toolCall() bool {
	var id, fname, args []byte
	switch c.Peek() {
	case 'n': // an empty call, as encoding/json decodes it
		if !c.Literal("null") {
			return false
		}
	case '{':
		c.Next()
		var seen uint32
		for first := true; ; first = false {
			key, done, ok := c.member(first)
			if !ok {
				return false
			}
			if done {
				break
			}
			switch string(key) {
			case "id":
				ok = once(&seen, 1<<0)
				if ok {
					id, ok = c.stringValue()
				}
			case "type":
				ok = once(&seen, 1<<1) && c.skipString()
			case "function":
				ok = once(&seen, 1<<2)
				if ok {
					fname, args, ok = c.function()
				}
			default:
				ok = c.unknown(key, 5, callFields...)
			}
			if !ok {
				return false
			}
		}
	default:
		return false
	}
	c.calls = append(c.calls, groupSep)
	c.calls = append(c.calls, "call"...)
	c.calls = append(c.calls, unitSep)
	c.calls = append(c.calls, id...)
	c.calls = append(c.calls, unitSep)
	c.calls = append(c.calls, fname...)
	c.calls = append(c.calls, unitSep)
	c.calls = append(c.calls, args...)
	return true
}

var functionFields = []string{"name", "arguments"}

func (c *chatScan) function() (name, args []byte, ok bool) {
	switch c.Peek() {
	case 'n':
		return nil, nil, c.Literal("null")
	case '{':
		c.Next()
	default:
		return nil, nil, false
	}
	var seen uint32
	for first := true; ; first = false {
		key, done, ok := c.member(first)
		if !ok {
			return nil, nil, false
		}
		if done {
			return name, args, true
		}
		switch string(key) {
		case "name":
			ok = once(&seen, 1<<0)
			if ok {
				name, ok = c.stringValue()
			}
		case "arguments":
			ok = once(&seen, 1<<1)
			if ok {
				args, ok = c.stringValue()
			}
		default:
			ok = c.unknown(key, 6, functionFields...)
		}
		if !ok {
			return nil, nil, false
		}
	}
}
