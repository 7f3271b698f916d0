"""Each loop of a kernel's SASS (a backward branch): its span, instruction count and most common
opcodes, for counting instructions per value (docs/GPU.md, "Third version: compress").

    nvcc -O3 -std=c++17 -arch=sm_90 -Iffi -cubin -o k.cubin k.cu    # k.cu: cuda6_codec.cuh's Compress called
    cuobjdump -sass k.cubin > k.sass
    python tools/v6_cuda/sass_loops.py k.sass GroupKernelILi1      # bf16 (ILi2 fp16, ILi3 fp32)

A per-value loop is unrolled: divide its count by its loads of the input (LDG). For a loop that
calls out (the decoder's slow values), "without its calls" counts what a warp issues when no lane
takes them: the loop less each block that a forward branch inside it jumps over and that holds a
CALL (docs/GPU.md, "Eighth version")."""
import re
import sys


def loops(text, name_part):
    for f in re.split(r"\n\s*Function : ", text)[1:]:
        name = f.split("\n")[0]
        if name_part not in name:
            continue
        ins = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", f)]
        print(name[:60], "total", len(ins))
        for a, op in ins:
            t = re.search(r"BRA (?:.*, )?0x([0-9a-f]+)", op)
            if t and int(t.group(1), 16) <= a:
                start = int(t.group(1), 16)
                kinds = {}
                body = [o for aa, o in ins if start <= aa <= a]
                for o in body:
                    k = re.sub(r"^@!?U?P\w+\s+", "", o.strip()).split()[0].split(".")[0]
                    kinds[k] = kinds.get(k, 0) + 1
                top = sorted(kinds.items(), key=lambda kv: -kv[1])[:9]
                print(f"  loop {start:#06x}-{a:#06x}: {len(body)} instructions  {top}")
                skipped = set()
                inner = any(int(m, 16) <= bb and start <= int(m, 16) and bb < a
                            for bb, o in ins if start <= bb < a for m in re.findall(r"BRA (?:.*, )?0x([0-9a-f]+)", o))
                for bb, o in ([] if inner else ins):  # an innermost loop's (an outer one's count means nothing)
                    j = re.search(r"BRA (?:.*, )?0x([0-9a-f]+)", o)
                    if start <= bb < a and j and bb < int(j.group(1), 16) <= a:
                        over = [(cc, oo) for cc, oo in ins if bb < cc < int(j.group(1), 16)]
                        if any(oo.strip().startswith("CALL") for _, oo in over):
                            skipped |= {cc for cc, _ in over}
                if skipped:
                    print(f"    without its calls: {len(body) - len(skipped)} instructions")


if __name__ == "__main__":
    loops(open(sys.argv[1]).read(), sys.argv[2])
