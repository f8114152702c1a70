package reply

// Usage is what the router reads of an engine's usage object, in any of
// the APIs it relays: Chat Completions and Completions (prompt_tokens,
// completion_tokens, prompt_tokens_details.cached_tokens), Responses
// (input_tokens, output_tokens, input_tokens_details.cached_tokens) and
// Anthropic Messages (input_tokens, which leaves out the prompt tokens
// read from or written to the cache, cache_read_input_tokens,
// cache_creation_input_tokens, output_tokens).
type Usage struct {
	// Present reports that the response had a usage object.
	Present bool
	// PromptTokens is the prompt's tokens: prompt_tokens, else the sum
	// of input_tokens, cache_read_input_tokens and
	// cache_creation_input_tokens (0 when absent or not integers).
	PromptTokens int64
	// CompletionTokens is completion_tokens, else output_tokens (0 when
	// absent or not an integer): what a tenant's output budget is
	// charged, and where the answer's blocks end in the engine's cache.
	CompletionTokens int64
	// HasCached reports that the usage told the prompt tokens served
	// from the cache as an integer, CachedTokens:
	// prompt_tokens_details.cached_tokens, else
	// input_tokens_details.cached_tokens, else cache_read_input_tokens.
	HasCached    bool
	CachedTokens int64
}

// The fields of a usage object the router reads (usageFields).
const (
	fPrompt        = iota // prompt_tokens
	fCompletion           // completion_tokens
	fInput                // input_tokens
	fOutput               // output_tokens
	fCacheRead            // cache_read_input_tokens
	fCacheCreation        // cache_creation_input_tokens
	fPromptCached         // prompt_tokens_details.cached_tokens
	fInputCached          // input_tokens_details.cached_tokens
	nUsageFields
)

// usageFields is what usage objects said, field by field: a stream's
// objects merge (merge), each naming some fields (Anthropic's
// message_start the input, its message_delta the output so far). has
// marks the fields set to an integer.
type usageFields struct {
	present bool
	has     uint16
	v       [nUsageFields]int64
}

// set records field f's value: an integer (isInt) sets it, anything
// else clears it (as with a duplicate key, the last value stands).
func (u *usageFields) set(f int, v int64, isInt bool) {
	if isInt {
		u.has |= 1 << f
		u.v[f] = v
		return
	}
	u.has &^= 1 << f
	u.v[f] = 0
}

func (u *usageFields) is(f int) bool { return u.has&(1<<f) != 0 }

// merge is u with the fields later set overriding its own.
func (u usageFields) merge(later usageFields) usageFields {
	u.present = u.present || later.present
	for f := range nUsageFields {
		if later.is(f) {
			u.set(f, later.v[f], true)
		}
	}
	return u
}

// usage resolves the fields into a Usage.
func (u usageFields) usage() Usage {
	out := Usage{Present: u.present}
	switch {
	case u.is(fPrompt):
		out.PromptTokens = u.v[fPrompt]
	case u.is(fInput) || u.is(fCacheRead) || u.is(fCacheCreation):
		out.PromptTokens = u.v[fInput] + u.v[fCacheRead] + u.v[fCacheCreation]
	}
	if u.is(fCompletion) {
		out.CompletionTokens = u.v[fCompletion]
	} else {
		out.CompletionTokens = u.v[fOutput]
	}
	for _, f := range []int{fPromptCached, fInputCached, fCacheRead} {
		if u.is(f) {
			out.HasCached, out.CachedTokens = true, u.v[f]
			break
		}
	}
	return out
}

// usageKeys are the integer fields of a usage object, by key.
var usageKeys = [...]struct {
	key string
	f   int
}{
	{"prompt_tokens", fPrompt}, {"completion_tokens", fCompletion}, {"input_tokens", fInput}, {"output_tokens", fOutput},
	{"cache_read_input_tokens", fCacheRead}, {"cache_creation_input_tokens", fCacheCreation},
}

// usage reads a usage value at depth: an object is a usage object
// (present), anything else says nothing.
func (s *scanner) usage(depth int) (usageFields, bool) {
	var u usageFields
	if s.Peek() != '{' {
		return u, s.Skip(depth)
	}
	s.Next()
	u.present = true
members:
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return u, false
		}
		if done {
			return u, true
		}
		for _, k := range usageKeys {
			if keyIs(key, k.key) {
				v, isInt, ok := s.intValue(depth + 1)
				if !ok {
					return u, false
				}
				u.set(k.f, v, isInt)
				continue members
			}
		}
		switch {
		case keyIs(key, "prompt_tokens_details"):
			v, has, ok := s.details(depth + 1)
			if !ok {
				return u, false
			}
			u.set(fPromptCached, v, has)
		case keyIs(key, "input_tokens_details"):
			v, has, ok := s.details(depth + 1)
			if !ok {
				return u, false
			}
			u.set(fInputCached, v, has)
		default:
			if !s.Skip(depth + 1) {
				return u, false
			}
		}
	}
}

// usageWithin reads an object at depth (a Responses event's "response",
// Anthropic's message_start "message") for its "usage"; the last one
// stands.
func (s *scanner) usageWithin(depth int) (usageFields, bool) {
	var u usageFields
	if s.Peek() != '{' {
		return u, s.Skip(depth)
	}
	s.Next()
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return u, false
		}
		if done {
			return u, true
		}
		if keyIs(key, "usage") {
			if u, ok = s.usage(depth + 1); !ok {
				return u, false
			}
			continue
		}
		if !s.Skip(depth + 1) {
			return u, false
		}
	}
}

// details reads a *_tokens_details object and returns its integer
// cached_tokens, if any.
func (s *scanner) details(depth int) (cached int64, has, ok bool) {
	if s.Peek() != '{' {
		return 0, false, s.Skip(depth)
	}
	s.Next()
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return 0, false, false
		}
		if done {
			return cached, has, true
		}
		if keyIs(key, "cached_tokens") {
			if cached, has, ok = s.intValue(depth + 1); !ok {
				return 0, false, false
			}
			if !has {
				cached = 0
			}
			continue
		}
		if !s.Skip(depth + 1) {
			return 0, false, false
		}
	}
}
