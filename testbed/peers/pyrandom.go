package peers

// PyRandom is CPython's module `random` generator (MT19937, the
// reference algorithm of Matsumoto and Nishimura) with the three calls
// verl's default balancer makes: seed(int), and choice(seq) through
// getrandbits. Same seed, same draws as `random.seed(n)` in CPython 3.11,
// so a replay of verl 0.9.1's tie-breaking (`random.choice(candidates)` in
// verl/workers/rollout/router.py, GlobalRequestLoadBalancer.acquire_server)
// can be compared decision for decision with verl's own class
// (tests/verl/test_verl_default_diff.py).
type PyRandom struct {
	mt  [624]uint32
	idx int
}

// NewPyRandom returns a generator seeded as CPython's random.seed(seed)
// seeds one from a non-negative int: init_by_array over the seed's 32-bit
// words, least significant first (one zero word for 0).
func NewPyRandom(seed uint64) *PyRandom {
	key := []uint32{uint32(seed)}
	if hi := uint32(seed >> 32); hi != 0 {
		key = append(key, hi)
	}
	r := &PyRandom{}
	r.initByArray(key)
	return r
}

func (r *PyRandom) initGenrand(s uint32) {
	r.mt[0] = s
	for i := 1; i < 624; i++ {
		r.mt[i] = 1812433253*(r.mt[i-1]^(r.mt[i-1]>>30)) + uint32(i)
	}
	r.idx = 624
}

func (r *PyRandom) initByArray(key []uint32) {
	r.initGenrand(19650218)
	i, j := 1, 0
	k := max(624, len(key))
	for ; k > 0; k-- {
		r.mt[i] = (r.mt[i] ^ ((r.mt[i-1] ^ (r.mt[i-1] >> 30)) * 1664525)) + key[j] + uint32(j)
		i++
		j++
		if i >= 624 {
			r.mt[0] = r.mt[623]
			i = 1
		}
		if j >= len(key) {
			j = 0
		}
	}
	for k = 623; k > 0; k-- {
		r.mt[i] = (r.mt[i] ^ ((r.mt[i-1] ^ (r.mt[i-1] >> 30)) * 1566083941)) - uint32(i)
		i++
		if i >= 624 {
			r.mt[0] = r.mt[623]
			i = 1
		}
	}
	r.mt[0] = 0x80000000
}

// Uint32 is genrand_uint32: the next tempered 32-bit output.
func (r *PyRandom) Uint32() uint32 {
	if r.idx >= 624 {
		for k := 0; k < 624; k++ {
			y := (r.mt[k] & 0x80000000) | (r.mt[(k+1)%624] & 0x7fffffff)
			v := r.mt[(k+397)%624] ^ (y >> 1)
			if y&1 != 0 {
				v ^= 0x9908b0df
			}
			r.mt[k] = v
		}
		r.idx = 0
	}
	y := r.mt[r.idx]
	r.idx++
	y ^= y >> 11
	y ^= (y << 7) & 0x9d2c5680
	y ^= (y << 15) & 0xefc60000
	y ^= y >> 18
	return y
}

// getrandbits is random.getrandbits(k) for 1 <= k <= 32.
func (r *PyRandom) getrandbits(k int) uint32 { return r.Uint32() >> (32 - k) }

// Below is random._randbelow(n) (n >= 1): k = n.bit_length() bits drawn
// until the value is below n. n = 1 still draws, as CPython does.
func (r *PyRandom) Below(n int) int {
	k := 0
	for v := n; v > 0; v >>= 1 {
		k++
	}
	x := int(r.getrandbits(k))
	for x >= n {
		x = int(r.getrandbits(k))
	}
	return x
}
