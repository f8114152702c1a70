// Package prompt renders the body of each OpenAI and Anthropic request the
// router routes (chat/completions, completions, responses, messages,
// embeddings) to the canonical prompt text that summary.Contract hashes,
// and appends a model's answer to it the way the next turn of the
// conversation will render it.
//
// The rendering is part of the hashing contract: routers that render one
// conversation differently would share hashes that mean different
// prefixes. summary's contract ID carries a render version for that, and
// TestRenderingIsPinned holds this package to it.
//
// Chat and completion bodies, the bulk of the traffic, are read by a
// single-pass scanner built on internal/jsonscan; the encoding/json
// rendering is the reference it must agree with and decides every body the
// scanner declines.
package prompt
