# Build llm-tray for Windows: a PyInstaller one-folder build (installers\llm-tray.spec), then the
# Inno Setup installer (installers\windows\llm-tray.iss).
#   powershell -ExecutionPolicy Bypass -File installers\windows\build.ps1
# Output: dist\llm-tray\ (llm-tray.exe: the tray, no console; llm-tray-cli.exe: the CLI) and
#         dist\llm-tray-<version>-windows-x64-setup.exe
# Needs Python 3.10+ (py launcher or $env:PYTHON) and Inno Setup 6 (ISCC.exe on PATH, or $env:ISCC,
# or its default folder). Environment: LLM_TRAY_BUILD_VENV (build\bundle-venv-windows).
$ErrorActionPreference = "Stop"
$Root = (Resolve-Path "$PSScriptRoot\..\..").Path
Set-Location $Root

function Invoke-Checked([string]$Exe, [string[]]$Arguments) {
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$Exe $($Arguments -join ' ') failed ($LASTEXITCODE)" }
}

# The version: trayapp.__version__, read from the source as the spec reads it.
$Match = Select-String -Path "$Root\trayapp\__init__.py" -Pattern '^__version__ = "([^"]+)"'
if (-not $Match) { throw "no __version__ in trayapp\__init__.py" }
$Version = $Match.Matches[0].Groups[1].Value

# Arrays built by assignment, not as an `if` expression (that would unroll a one-element array).
$Python = "py"
$PyArgs = @("-3")
if ($env:PYTHON) { $Python = $env:PYTHON; $PyArgs = @() }
$Venv = if ($env:LLM_TRAY_BUILD_VENV) { $env:LLM_TRAY_BUILD_VENV } else { "$Root\build\bundle-venv-windows" }
$VenvPy = "$Venv\Scripts\python.exe"
if (-not (Test-Path $VenvPy)) { Invoke-Checked $Python (@($PyArgs) + @("-m", "venv", $Venv)) }
Invoke-Checked $VenvPy @("installers\icon_files.py", "--check")  # the .ico matches resources\icons
Invoke-Checked $VenvPy @("-m", "pip", "install", "-q", "--upgrade", "pip")
Invoke-Checked $VenvPy @("-m", "pip", "install", "-q", ".", "pyinstaller")
Invoke-Checked $VenvPy @("-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
    "--distpath", "$Root\dist", "--workpath", "$Root\build\pyinstaller-windows", "installers\llm-tray.spec")

$Dist = "$Root\dist\llm-tray"
$Said = (& "$Dist\llm-tray-cli.exe" --version | Out-String).Trim()  # also: the bundle starts
if ($Said -ne "llm-tray $Version") { throw "the bundle says '$Said', expected 'llm-tray $Version'" }

$Iscc = $env:ISCC
if (-not $Iscc) { $Iscc = (Get-Command ISCC.exe -ErrorAction SilentlyContinue).Source }
if (-not $Iscc) { $Iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
if (-not (Test-Path $Iscc)) { throw "Inno Setup 6 not found: install it (winget install JRSoftware.InnoSetup) or set ISCC" }
Invoke-Checked $Iscc @("/Q", "/DAppVersion=$Version", "/DDistDir=$Dist", "installers\windows\llm-tray.iss")

$Setup = "$Root\dist\llm-tray-$Version-windows-x64-setup.exe"
$FolderMiB = [math]::Round(((Get-ChildItem $Dist -Recurse -File | Measure-Object Length -Sum).Sum / 1MB), 1)
$SetupMiB = [math]::Round((Get-Item $Setup).Length / 1MB, 1)
Write-Host "bundle: $Dist ($FolderMiB MiB)"
Write-Host "installer: $Setup ($SetupMiB MiB)"
