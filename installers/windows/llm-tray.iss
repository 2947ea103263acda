; Inno Setup 6.3+ script for llm-tray on Windows: a per-user install (no administrator rights).
;   installers\windows\build.ps1   builds dist\llm-tray\ with PyInstaller, then runs
;   ISCC /DAppVersion=<trayapp.__version__> /DDistDir=<dist\llm-tray> installers\windows\llm-tray.iss
; Output: dist\llm-tray-<version>-windows-x64-setup.exe
; Start at login is the app's own HKCU Run value "llm-tray" (trayapp/services/autostart.py, the tray's
; "Start at login" item, `llm-tray autostart on|off`): the task below writes that same value, never a
; {userstartup} shortcut (that would start a second copy), and the uninstaller removes it.
; tests/unit/test_installer_manifests.py checks this file against the app (name, version, icon, value).

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#ifndef DistDir
  #define DistDir "..\..\dist\llm-tray"
#endif
#define AppName "llm-tray"
#define AppExe "llm-tray.exe"
#define RunKey "Software\Microsoft\Windows\CurrentVersion\Run"

[Setup]
AppId={{8E7C5B4A-2F1D-4C3B-9A6E-6C1D7B0F3E21}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=llm-tray
VersionInfoVersion={#AppVersion}
PrivilegesRequired=lowest
DefaultDirName={localappdata}\Programs\{#AppName}
DisableProgramGroupPage=yes
UninstallDisplayIcon={app}\{#AppExe}
UninstallDisplayName={#AppName}
SetupIconFile=llm-tray.ico
OutputDir=..\..\dist
OutputBaseFilename={#AppName}-{#AppVersion}-windows-x64-setup
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
Compression=lzma2
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes
RestartApplications=no

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "autostart"; Description: "Start {#AppName} when I sign in"; GroupDescription: "Start at login:"
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#DistDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"; Comment: "Live decode speed of local LLM servers"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Registry]
; The value the app writes itself (autostart.enable: the windowed exe, then --at-login).
Root: HKCU; Subkey: "{#RunKey}"; ValueType: string; ValueName: "{#AppName}"; ValueData: """{app}\{#AppExe}"" --at-login"; Tasks: autostart; Flags: uninsdeletevalue

[Run]
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallRun]
; The running tray holds its files open: stop it first (only this user's processes can be stopped).
Filename: "{sys}\taskkill.exe"; Parameters: "/F /T /IM {#AppExe}"; Flags: runhidden; RunOnceId: "StopTray"

[Code]
{ The tray's "Start at login" item may have written the Run value after setup (the task unticked):
  the [Registry] entry removes only what setup wrote, so the uninstaller removes the value here too. }
procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
begin
  if CurUninstallStep = usUninstall then
    RegDeleteValue(HKEY_CURRENT_USER, '{#RunKey}', '{#AppName}');
end;
