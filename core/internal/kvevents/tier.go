package kvevents

import "strings"

// Tier is a storage tier of the KV-cache index. The numeric values are part
// of the contract: the index uses 0, 1 and 2 the same way.
type Tier uint8

const (
	TierGPU Tier = 0 // device memory (vLLM block pool)
	TierCPU Tier = 1 // host memory (native offload, LMCache CPU)
	TierSSD Tier = 2 // disk, shared storage, object store
)

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierSSD:
		return "ssd"
	}
	return "tier?"
}

// TierOf maps an event's medium to a Tier, case-insensitively:
// "" (absent) and "GPU" -> TierGPU, as are LMCache's device strings
// "cuda" / "cuda:N"; "CPU" and SGLang's "CPU_PINNED" (HiCache host memory)
// -> TierCPU; "DISK", "STORAGE", "SHARED_STORAGE", "OBJECT_STORE" and
// SGLang's "EXTERNAL" (a shared or remote pool such as Mooncake) ->
// TierSSD. Anything else returns ok == false.
func TierOf(medium string) (tier Tier, ok bool) {
	switch {
	case medium == "" || strings.EqualFold(medium, "GPU"):
		return TierGPU, true
	case strings.EqualFold(medium, "CPU"), strings.EqualFold(medium, "CPU_PINNED"):
		return TierCPU, true
	case strings.EqualFold(medium, "DISK"), strings.EqualFold(medium, "STORAGE"),
		strings.EqualFold(medium, "SHARED_STORAGE"), strings.EqualFold(medium, "OBJECT_STORE"),
		strings.EqualFold(medium, "EXTERNAL"):
		return TierSSD, true
	case len(medium) >= 4 && strings.EqualFold(medium[:4], "cuda") &&
		(len(medium) == 4 || medium[4] == ':'):
		return TierGPU, true
	}
	return 0, false
}
