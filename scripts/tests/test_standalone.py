"""The repository stands alone: no tracked file points outside it (a folder of common notes
beside the checkout, which a clone does not have) or names an issue number (a reader does not have the
issues: name the feature instead), and the benchmark scripts and their baselines name only
scripts and sources the repository has. Run by scripts/test.sh's py-tests stage."""
import os
import re
import subprocess
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The outside folder's name, and every pattern and example below, are built from pieces, so
# that this file names no path outside the repository (it is not scanned either).
FOLDER = "sha" + "red"
OUTSIDE = re.compile("|".join([r"\.\./" + FOLDER, r"(?<![\w./-])" + FOLDER + "/(?:docs|baselines|hooks)",
                               "/work/" + FOLDER]))
ISSUE = re.compile(r"\b[Ii]" + r"ssues?(?: +|-)(?:#|no\.? *)?[0-9]+\b|\b[Ii]" + r"ssue #[0-9]+")


def tracked_files():
    """The files git tracks (with their paths relative to the repository)."""
    out = subprocess.run(["git", "-C", REPO, "ls-files", "-z"], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def offending_lines(pattern):
    """'path:line: text' of every tracked text file's line that matches `pattern`."""
    found = []
    this = os.path.relpath(os.path.abspath(__file__), REPO)
    for path in tracked_files():
        if path == this:
            continue  # its examples of what must not appear

        full = os.path.join(REPO, path)
        if not os.path.isfile(full) or os.path.islink(full):
            continue
        with open(full, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path}:{n}: {line.strip()[:120]}")
    return found


# A script or source that the benchmarks and their baselines name: by its path in the
# repository, or by its bare name (a script beside another).
NAMED = re.compile(r"(?:scripts|plugin-tests)/[\w./-]+\.(?:sh|py|c)\b|(?<![\w/.-])[\w-]+\.sh\b")


class StandsAlone(unittest.TestCase):
    def test_the_patterns_catch_what_they_are_for(self):
        for bad in ["see ../" + FOLDER + "/docs/x.md", "BASELINES=/work/" + FOLDER + "/baselines",
                    "written from " + FOLDER + "/docs/nccl-abi.md"]:
            self.assertRegex(bad, OUTSIDE)
        for bad in ["I" + "ssue 32 item 3", "(i" + "ssue 29)", "i" + "ssues 3 and 4", "i" + "ssue #12",
                    "the i" + "ssue-33 additions"]:
            self.assertRegex(bad, ISSUE)
        self.assertEqual(NAMED.findall("(see run-mpi.sh) scripts/baselines/build.sh x.c"),
                         ["run-mpi.sh", "scripts/baselines/build.sh"])
        for fine in ["docs/nccl-abi.md", "shared memory", "a " + FOLDER + "/ folder", "tis" + "sue 3"]:
            self.assertNotRegex(fine, OUTSIDE)
            self.assertNotRegex(fine, ISSUE)

    def test_no_tracked_file_points_outside_the_repository(self):
        found = offending_lines(OUTSIDE)
        self.assertEqual(found, [], "files that point outside the repository:\n" + "\n".join(found))

    def test_the_benchmarks_name_only_files_of_the_repository(self):
        tracked = tracked_files()
        names = {os.path.basename(p) for p in tracked}
        scripts = [p for p in tracked if re.match(r"scripts/(bench-[\w-]+\.sh|baselines/)", p)]
        self.assertIn("scripts/baselines/mpi_coll_bench.c", scripts)
        missing = []
        for path in scripts:
            with open(os.path.join(REPO, path), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    for name in NAMED.findall(line):
                        if name not in tracked and ("/" in name or name not in names):
                            missing.append(f"{path}:{n}: {name}")
        self.assertEqual(missing, [], "named but not in the repository:\n" + "\n".join(missing))

    def test_no_tracked_file_names_an_issue_number(self):
        found = offending_lines(ISSUE)
        self.assertEqual(found, [], "name the feature, not the issue:\n" + "\n".join(found))


if __name__ == "__main__":
    unittest.main()
