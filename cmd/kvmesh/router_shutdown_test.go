package main

import (
	"testing"
	"time"
)

// TestShutdownBudget: a shutdown's steps fit in the drain timeout, so a
// router exits within it whatever its peers do; the leave never takes
// more than 2 s nor the reserve more than 1 s.
func TestShutdownBudget(t *testing.T) {
	tests := []struct {
		drain                       time.Duration
		leave, reserve, admin, rest time.Duration
	}{
		{60 * time.Second, 2 * time.Second, time.Second, 500 * time.Millisecond, 500 * time.Millisecond},
		{4 * time.Second, time.Second, 400 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond},
		{100 * time.Millisecond, 25 * time.Millisecond, 10 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond},
		{time.Nanosecond, time.Millisecond, 0, 0, 0},
	}
	for _, tc := range tests {
		b := shutdownBudget(tc.drain)
		if b.leave != tc.leave || b.reserve != tc.reserve || b.admin != tc.admin || b.rest != tc.rest {
			t.Errorf("shutdownBudget(%v) = %+v, want leave %v reserve %v admin %v rest %v", tc.drain, b, tc.leave, tc.reserve, tc.admin, tc.rest)
		}
		if tc.drain >= time.Millisecond && b.leave+4*b.rest+b.reserve > tc.drain {
			t.Errorf("shutdownBudget(%v): leave %v, rest %v and reserve %v leave nothing to drain", tc.drain, b.leave, b.rest, b.reserve)
		}
	}
}
