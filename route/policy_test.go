package route

import (
	"errors"
	"math"
	"testing"
)

func TestPolicyValidate(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name  string
		edit  func(*Policy)
		field string // "" when valid
	}{
		{"default", func(*Policy) {}, ""},
		{"load factor 1", func(p *Policy) { p.LoadFactor = 1 }, ""},
		{"load factor under 1", func(p *Policy) { p.LoadFactor = 0.99 }, "LoadFactor"},
		{"load factor NaN", func(p *Policy) { p.LoadFactor = nan }, "LoadFactor"},
		{"inflight factor under 1", func(p *Policy) { p.InFlightFactor = 0.5 }, "InFlightFactor"},
		{"key blocks 0", func(p *Policy) { p.KeyBlocks = 0 }, "KeyBlocks"},
		{"key blocks 1", func(p *Policy) { p.KeyBlocks = 1 }, ""},
		{"min excess 0", func(p *Policy) { p.MinExcessBlocks = 0 }, ""},
		{"block ms 0", func(p *Policy) { p.DefaultBlockMs = 0 }, "DefaultBlockMs"},
		{"block ms NaN", func(p *Policy) { p.DefaultBlockMs = nan }, "DefaultBlockMs"},
		{"recompute weight under 1", func(p *Policy) { p.RecomputeWeight = 0.5 }, "RecomputeWeight"},
		{"seq ms negative", func(p *Policy) { p.DefaultSeqMs = -1 }, "DefaultSeqMs"},
		{"first of two reported", func(p *Policy) { p.KeyBlocks, p.DefaultSeqMs = 0, 0 }, "KeyBlocks"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultPolicy()
			tc.edit(&p)
			err := p.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var pe *PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("Validate() = %v, want a *PolicyError", err)
			}
			if pe.Field != tc.field {
				t.Errorf("field %q, want %q (%v)", pe.Field, tc.field, err)
			}
		})
	}
}
